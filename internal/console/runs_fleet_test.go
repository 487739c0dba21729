package console_test

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// page GETs a page of the site's console: its status and body.
func (s *site) page(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(s.url(path))
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// graphBox is a node's box on a run's page, as drawn.
type graphBox struct {
	state, code, layer, href string
}

// boxesOn reads the node boxes of a run's page, by node.
func boxesOn(page string) map[string]graphBox {
	out := map[string]graphBox{}
	re := regexp.MustCompile(`<(?:a|g) class="node [^"]*"(?: href="([^"]*)")? data-node="([^"]+)" data-state="([a-z_]+)" data-layer="(\d+)"[^>]*?(?: data-code="([a-z_]+)")?>`)
	for _, m := range re.FindAllStringSubmatch(page, -1) {
		out[m[2]] = graphBox{href: m[1], state: m[3], layer: m[4], code: m[5]}
	}
	return out
}

// edgesOn reads the edges of a run's page, parent>child, in the order
// drawn.
func edgesOn(page string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`class="edge[^"]*" data-from="([^"]+)" data-to="([^"]+)"`).FindAllStringSubmatch(page, -1) {
		out = append(out, m[1]+">"+m[2])
	}
	return out
}

// runRowOn is a run's row on the runs page.
func runRowOn(t *testing.T, page, id string) string {
	t.Helper()
	start := strings.Index(page, fmt.Sprintf(`<tr id="run-%s"`, id))
	if start < 0 {
		t.Fatalf("run %s is not listed", id)
	}
	row := page[start:]
	return row[:strings.Index(row, "</tr>")]
}

// TestRunPagesOfADiamondThatEnded: a diamond run through a real fleet,
// once it has ended: its page draws its four nodes in three layers with
// their four edges, every node succeeded and linked to its job's page;
// the runs page lists it with its round and nodes by state; each node's
// job's page links the run.
func TestRunPagesOfADiamondThatEnded(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-diamond")
	r := &job.RunRequest{ID: "diamond", Nodes: []job.RunNode{
		shNode("a", "echo a"), shNode("b", "echo b", "a"), shNode("c", "echo c", "a"), shNode("d", "echo d", "b", "c"),
	}}
	submitRun(t, s, r)
	if end := awaitRun(t, s, r.ID, 30*time.Second); end.State != job.RunSucceeded {
		t.Fatalf("the run ended %s", ended(s, end))
	}

	code, page := s.page(t, "/ui/runs/default/diamond")
	if code != http.StatusOK {
		t.Fatalf("the run's page: %d", code)
	}
	boxes := boxesOn(page)
	if len(boxes) != len(r.Nodes) {
		t.Errorf("%d node boxes, want %d: %v", len(boxes), len(r.Nodes), boxes)
	}
	layers := map[string]string{"a": "0", "b": "1", "c": "1", "d": "2"}
	var want []string
	for _, nd := range r.Nodes {
		for _, p := range nd.After {
			want = append(want, p+">"+nd.ID)
		}
		b := boxes[nd.ID]
		if b.state != string(job.StateSucceeded) || b.layer != layers[nd.ID] {
			t.Errorf("node %s: %s in layer %s, want succeeded in layer %s", nd.ID, b.state, b.layer, layers[nd.ID])
		}
		if jp := jobPage("default", "default", r.ID+":"+nd.ID); b.href != jp {
			t.Errorf("node %s links to %q, want %q", nd.ID, b.href, jp)
		}
	}
	got := edgesOn(page)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("edges %v, want %v", got, want)
	}
	for _, frag := range []string{`id="run-state">succeeded<`, `id="run-round">1<`, `data-count="succeeded">4 succeeded<`,
		`id="run-nodes">4 in 3 layers, 4 edges<`, `aria-current="page">Runs</a>`} {
		if !strings.Contains(page, frag) {
			t.Errorf("the run's page has no %s", frag)
		}
	}
	if strings.Contains(page, `id="run-cancel"`) || strings.Contains(page, `id="run-retry"`) {
		t.Error("a run that succeeded offers cancel or retry")
	}

	_, page = s.page(t, "/ui/runs")
	row := runRowOn(t, page, r.ID)
	for _, frag := range []string{`data-state="succeeded"`, `<a href="/ui/runs/default/diamond">`, `<td class="n round">1</td>`,
		`<td class="n nodes">4</td>`, `data-count="succeeded">4 succeeded<`} {
		if !strings.Contains(row, frag) {
			t.Errorf("the run's row has no %s: %s", frag, row)
		}
	}

	// Each node's job's page names the run and the node, and links the run.
	for _, nd := range r.Nodes {
		var body string
		waitFor(t, "node "+nd.ID+"'s job's page", 10*time.Second, func() bool {
			code, body = s.page(t, boxes[nd.ID].href)
			return code == http.StatusOK
		})
		if want := fmt.Sprintf(`<a href="/ui/runs/default/diamond" id="job-run">diamond</a> / %s<`, nd.ID); !strings.Contains(body, want) {
			t.Errorf("node %s's job's page does not link its run: no %s", nd.ID, want)
		}
	}
}

// TestRunPageOfARunThatFailed: a run whose first node fails, through a
// real fleet: the nodes after it, and the nodes after those, end
// cancelled without running (upstream_failed); a node that comes after
// none of them succeeds; the run failed, and its page offers retry, not
// cancel; the runs page counts its nodes by state.
func TestRunPageOfARunThatFailed(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-failing")
	r := &job.RunRequest{ID: "failing", Nodes: []job.RunNode{
		shNode("x", "exit 3"), shNode("y", "echo y", "x"), shNode("z", "echo z", "y"), shNode("alone", "echo alone"),
	}}
	submitRun(t, s, r)
	if end := awaitRun(t, s, r.ID, 30*time.Second); end.State != job.RunFailed {
		t.Fatalf("the run ended %s", ended(s, end))
	}

	_, page := s.page(t, "/ui/runs/default/failing")
	want := map[string]graphBox{
		"x":     {state: string(job.StateFailed), code: string(job.CodeExitCode)},
		"y":     {state: string(job.StateCancelled), code: string(job.CodeUpstreamFailed)},
		"z":     {state: string(job.StateCancelled), code: string(job.CodeUpstreamFailed)},
		"alone": {state: string(job.StateSucceeded)},
	}
	boxes := boxesOn(page)
	if len(boxes) != len(want) {
		t.Errorf("%d node boxes, want %d", len(boxes), len(want))
	}
	for id, w := range want {
		if b := boxes[id]; b.state != w.state || b.code != w.code {
			t.Errorf("node %s: %s/%s, want %s/%s", id, b.state, b.code, w.state, w.code)
		}
	}
	if got := edgesOn(page); !slices.Equal(got, []string{"x>y", "y>z"}) {
		t.Errorf("edges %v", got)
	}
	for _, frag := range []string{`id="run-state">failed<`, "node z · cancelled · upstream_failed", `id="run-retry"`,
		`data-count="failed">1 failed<`, `data-count="cancelled">2 cancelled<`} {
		if !strings.Contains(page, frag) {
			t.Errorf("the run's page has no %s", frag)
		}
	}
	if strings.Contains(page, `id="run-cancel"`) {
		t.Error("a run that ended offers cancel")
	}

	_, page = s.page(t, "/ui/runs")
	row := runRowOn(t, page, r.ID)
	for _, frag := range []string{`data-state="failed"`, `<td class="n nodes">4</td>`, `data-count="succeeded">1 succeeded<`,
		`data-count="failed">1 failed<`, `data-count="cancelled">2 cancelled<`} {
		if !strings.Contains(row, frag) {
			t.Errorf("the run's row has no %s: %s", frag, row)
		}
	}
}
