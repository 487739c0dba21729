package console_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleet-dev/fleet/job"
)

// shNode is a node of a run whose job runs script in sh, after the nodes
// named.
func shNode(id, script string, after ...string) job.RunNode {
	return job.RunNode{ID: id, After: after, Job: &job.Request{Command: []string{"sh", "-c", script}}}
}

func submitRun(t *testing.T, s *site, r *job.RunRequest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reply, err := s.f.Client.SubmitRun(ctx, r)
	if err != nil || reply.Rejected() || reply.Duplicate {
		t.Fatalf("submit run %s: %+v %v", r.ID, reply, err)
	}
}

// awaitRun waits for the end of a run's round.
func awaitRun(t *testing.T, s *site, id string, within time.Duration) *job.RunEnd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	end, err := s.f.Client.RunResult(ctx, id)
	if err != nil {
		t.Fatalf("run %s: %v", id, err)
	}
	return end
}

// ended says how each node of a run's round ended, and why a node whose
// job did not succeed ended so (its result's failure), for the message
// of a test that expected the run to end otherwise.
func ended(s *site, end *job.RunEnd) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, round %d:", end.State, end.Round)
	for _, n := range end.Nodes {
		fmt.Fprintf(&b, " %s %s", n.ID, n.State)
		if n.Code != "" {
			fmt.Fprintf(&b, " (%s)", n.Code)
		}
		if n.State != job.StateSucceeded && n.JobID != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if r, err := s.f.Client.Result(ctx, n.JobID); err == nil && r.Failure != nil {
				fmt.Fprintf(&b, " [%s after %d attempts: %s; stderr %q]", r.Failure.Code, r.Attempts, r.Failure.Message, r.Stderr)
			}
			cancel()
		}
		b.WriteString(";")
	}
	return b.String()
}

// graphNode selects a node's box in a run's graph.
func graphNode(id string) string { return fmt.Sprintf(`svg.graph .node[data-node=%q]`, id) }

// clickSVG follows the link of the first SVG element matching sel, from
// inside the page, once it is there (an SVG element has no click()).
func (b *browser) clickSVG(t *testing.T, sel string) {
	t.Helper()
	waitFor(t, "a "+sel+" to click", 10*time.Second, func() bool {
		return eval[bool](t, b, fmt.Sprintf(`(function(){var e=document.querySelector(%q);if(!e)return false;`+
			`e.dispatchEvent(new MouseEvent("click",{bubbles:true,cancelable:true,view:window}));return true})()`, sel))
	})
}

// TestConsoleDrawsARunLive: a diamond run whose last node waits for a
// file: its page draws the four nodes in three layers with their four
// edges, each node coloured by its state and linked to its job's page
// (whose id has a colon); once the file is made, the page follows the
// last node and the run to succeeded without a reload. The node's link
// leads to its job's page, which leads back to the run; the runs page
// lists the run with its nodes counted.
func TestConsoleDrawsARunLive(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-runs")
	gate := filepath.Join(t.TempDir(), "release-d")
	submitRun(t, s, &job.RunRequest{ID: "diamond", Nodes: []job.RunNode{
		shNode("a", "echo a"), shNode("b", "echo b", "a"), shNode("c", "echo c", "a"),
		shNode("d", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; echo d", gate), "b", "c"),
	}})

	b := newBrowser(t)
	b.open(t, s.url("/ui/runs/default/diamond"))
	eval[bool](t, b, `window.__notReloaded = true`)
	if b.attr(t, "#nav-runs", "aria-current") != "page" {
		t.Error("the nav does not mark the runs")
	}
	state := func(id string) string { return b.attr(t, graphNode(id), "data-state") }
	waitFor(t, "a, b and c succeeded and d running on the page", 20*time.Second, func() bool {
		return state("a") == "succeeded" && state("b") == "succeeded" && state("c") == "succeeded" && state("d") == "running"
	})
	waitFor(t, "the page live", 5*time.Second, func() bool { return strings.HasPrefix(b.text(t, "#status"), "live") })
	if n := eval[int](t, b, `document.querySelectorAll("svg.graph .node").length`); n != 4 {
		t.Errorf("%d node boxes, want 4", n)
	}
	for id, layer := range map[string]string{"a": "0", "b": "1", "c": "1", "d": "2"} {
		if got := b.attr(t, graphNode(id), "data-layer"); got != layer {
			t.Errorf("node %s in layer %s, want %s", id, got, layer)
		}
		if got, want := b.attr(t, graphNode(id), "href"), jobPage("default", "default", "diamond:"+id); got != want {
			t.Errorf("node %s links to %q, want %q", id, got, want)
		}
	}
	// Each box is coloured by its state (the stylesheet's, not a default).
	fill := func(id string) string {
		return eval[string](t, b, fmt.Sprintf(`getComputedStyle(document.querySelector(%q)).fill`, graphNode(id)+" rect"))
	}
	if fill("a") == fill("d") || fill("a") != fill("b") {
		t.Errorf("fills: a %s, b %s, d %s: succeeded and running alike, or two succeeded apart", fill("a"), fill("b"), fill("d"))
	}
	edges := eval[string](t, b, `Array.from(document.querySelectorAll("svg.graph path.edge")).map(e => e.dataset.from + ">" + e.dataset.to).join(" ")`)
	if edges != "a>b a>c b>d c>d" {
		t.Errorf("edges %q", edges)
	}
	if b.text(t, "#run-state") != "running" || b.text(t, "#run-round") != "1" || b.text(t, "#run-cancelled") != "no" ||
		!b.exists(t, "#run-cancel") || b.exists(t, "#run-retry") {
		t.Errorf("the run's head: %q, round %q, cancel requested %q, or not cancel alone", b.text(t, "#run-state"),
			b.text(t, "#run-round"), b.text(t, "#run-cancelled"))
	}

	// d is let go: the page follows it to the end, live.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d and the run succeeded on the page", 20*time.Second, func() bool {
		return state("d") == "succeeded" && b.text(t, "#run-state") == "succeeded"
	})
	if !eval[bool](t, b, `window.__notReloaded === true`) {
		t.Error("the page was reloaded")
	}
	if b.exists(t, "#run-cancel") || b.exists(t, "#run-retry") {
		t.Error("a run that succeeded offers cancel or retry")
	}
	if !strings.Contains(b.text(t, "#run-counts"), "4 succeeded") {
		t.Errorf("the counts: %q", b.text(t, "#run-counts"))
	}

	// A node's box leads to its job's page, and that page to the run.
	b.clickSVG(t, graphNode("b"))
	waitFor(t, "b's job's page", 10*time.Second, func() bool {
		return strings.HasSuffix(b.location(t), jobPage("default", "default", "diamond:b"))
	})
	b.do(t, chromedp.WaitVisible(chromedp.ID("live")))
	waitFor(t, "the job's page live", 5*time.Second, func() bool { return strings.HasPrefix(b.text(t, "#status"), "live") })
	if b.text(t, "h1 .id") != "diamond:b" || !b.exists(t, "h1 .s-succeeded") || !strings.Contains(b.text(t, "#stdout"), "b") {
		t.Errorf("b's job's page: %q", b.text(t, "h1"))
	}
	if href := b.attr(t, "#job-run", "href"); href != "/ui/runs/default/diamond" {
		t.Errorf("the job's page links its run at %q", href)
	}

	// The runs page lists it, its nodes counted.
	b.open(t, s.url("/ui/runs"))
	row := `[id="run-diamond"]`
	waitFor(t, "the run listed", 10*time.Second, func() bool { return b.attr(t, row, "data-state") == "succeeded" })
	if got := b.text(t, row+" td.counts"); got != "4 succeeded" {
		t.Errorf("the run's counts: %q", got)
	}
	b.click(t, row+" td.id a")
	waitFor(t, "the run's page from its row", 10*time.Second, func() bool { return b.exists(t, "#run-state") })
	b.visitAll(t, s, "/ui/runs/default/diamond")
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}

// TestConsoleCancelsAndRetriesARun: a run whose first node fails shows
// the node after it cancelled without running (upstream_failed, in its
// tooltip) and offers retry; retried, its round 2 runs both again, as new
// jobs, and succeeds. Cancel on a running run's page ends its node
// cancelled, and the run.
func TestConsoleCancelsAndRetriesARun(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-run-actions")
	gate := filepath.Join(t.TempDir(), "fixed")
	submitRun(t, s, &job.RunRequest{ID: "gated", Nodes: []job.RunNode{
		shNode("x", fmt.Sprintf("[ -e %s ] || exit 3", gate)), shNode("y", "echo y", "x"),
	}})
	if end := awaitRun(t, s, "gated", 30*time.Second); end.State != job.RunFailed {
		t.Fatalf("the run ended %s", ended(s, end))
	}
	b := newBrowser(t)
	b.open(t, s.url("/ui/runs/default/gated"))
	if b.text(t, "#run-state") != "failed" || b.attr(t, graphNode("x"), "data-state") != "failed" ||
		b.attr(t, graphNode("y"), "data-code") != "upstream_failed" {
		t.Fatalf("the failed run: %q, x %q, y's code %q", b.text(t, "#run-state"), b.attr(t, graphNode("x"), "data-state"),
			b.attr(t, graphNode("y"), "data-code"))
	}
	if title := b.text(t, graphNode("y")+" title"); !strings.Contains(title, "cancelled · upstream_failed") {
		t.Errorf("y's tooltip: %q", title)
	}
	if b.exists(t, "#run-cancel") || !b.exists(t, "#run-retry") {
		t.Fatal("a failed run does not offer retry alone")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	eval[bool](t, b, `window.confirm = function () { return true }; true`)
	b.click(t, "#run-retry")
	waitFor(t, "round 2 succeeded on the page", 30*time.Second, func() bool {
		return b.text(t, "#run-round") == "2" && b.text(t, "#run-state") == "succeeded"
	})
	if !strings.Contains(b.text(t, ".notice"), "round 2 runs 2 nodes again") {
		t.Errorf("the notice: %q", b.text(t, ".notice"))
	}
	if got, want := b.attr(t, graphNode("x"), "href"), jobPage("default", "default", "gated:x:2"); got != want {
		t.Errorf("x links to %q in round 2, want %q", got, want)
	}

	submitRun(t, s, &job.RunRequest{ID: "long", Nodes: []job.RunNode{shNode("sleepy", "sleep 60")}})
	b.open(t, s.url("/ui/runs/default/long"))
	waitFor(t, "the node running", 20*time.Second, func() bool { return b.attr(t, graphNode("sleepy"), "data-state") == "running" })
	eval[bool](t, b, `window.confirm = function () { return true }; true`)
	b.click(t, "#run-cancel")
	waitFor(t, "the run cancelled on the page", 20*time.Second, func() bool {
		return b.text(t, "#run-state") == "cancelled" && b.attr(t, graphNode("sleepy"), "data-state") == "cancelled"
	})
	if b.text(t, "#run-cancelled") != "yes" {
		t.Errorf("cancel requested: %q", b.text(t, "#run-cancelled"))
	}
	if end := awaitRun(t, s, "long", 10*time.Second); end.State != job.RunCancelled {
		t.Errorf("the run ended %s", ended(s, end))
	}
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}
