// Fleet console: keeps the page's live part up to date from the server's
// event stream, at the rate the operator picks (or paused), and carries
// over what the operator was doing (checked boxes, the log's scroll, a
// graph's scroll).
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("status");
  var rate = document.getElementById("refresh");
  var source = null;

  function chosen() {
    try { return localStorage.getItem("fleet.refresh") || "1s"; } catch (e) { return "1s"; }
  }
  function setStatus(text, cls) {
    if (!status) return;
    status.textContent = text;
    status.className = "status " + (cls || "");
  }
  function stop() {
    if (source) { source.close(); source = null; }
  }
  function start() {
    stop();
    if (!live || !live.dataset.stream) return;
    var every = chosen();
    if (every === "off") { setStatus("paused", "off"); return; }
    if (document.hidden) { setStatus("paused while hidden", "off"); return; }
    var url = live.dataset.stream + (live.dataset.stream.indexOf("?") < 0 ? "?" : "&") + "every=" + encodeURIComponent(every);
    source = new EventSource(url);
    source.addEventListener("page", function (ev) {
      swap(ev.data);
      setStatus("live · " + new Date().toLocaleTimeString(), "ok");
    });
    source.onopen = function () { setStatus("live", "ok"); };
    source.onerror = function () { setStatus("reconnecting…", "warn"); };
  }

  function swap(html) {
    var checked = {};
    live.querySelectorAll("input[type=checkbox]:checked").forEach(function (i) { checked[i.value] = true; });
    var log = document.getElementById("log");
    var atBottom = !log || log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    var logTop = log ? log.scrollTop : 0;
    // Boxes that scroll (a run's graph) stay where the operator left them.
    var kept = {};
    live.querySelectorAll("[data-keep-scroll][id]").forEach(function (e) { kept[e.id] = [e.scrollLeft, e.scrollTop]; });
    live.innerHTML = html;
    Object.keys(kept).forEach(function (id) {
      var e = document.getElementById(id);
      if (e) { e.scrollLeft = kept[id][0]; e.scrollTop = kept[id][1]; }
    });
    live.querySelectorAll("input[type=checkbox]").forEach(function (i) { if (checked[i.value]) i.checked = true; });
    log = document.getElementById("log");
    if (log) log.scrollTop = atBottom ? log.scrollHeight : logTop;
  }

  if (rate) {
    rate.value = chosen();
    rate.addEventListener("change", function () {
      try { localStorage.setItem("fleet.refresh", rate.value); } catch (e) { /* private mode */ }
      start();
    });
  }
  document.addEventListener("visibilitychange", function () { if (document.hidden) { stop(); setStatus("paused while hidden", "off"); } else { start(); } });
  document.addEventListener("submit", function (ev) {
    var msg = ev.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });
  document.addEventListener("change", function (ev) {
    if (ev.target.id === "select-all") {
      live.querySelectorAll("input[name=job]").forEach(function (i) { i.checked = ev.target.checked; });
    }
  });
  var log = document.getElementById("log");
  if (log) log.scrollTop = log.scrollHeight;
  start();
})();
