package console

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

// graphOf is a run's nodes from "id:parent,parent" specs, each node's job
// of round 1 in the default pool, in state st.
func graphOf(run string, st job.State, specs ...string) []job.NodeView {
	out := make([]job.NodeView, len(specs))
	for i, s := range specs {
		id, after, _ := strings.Cut(s, ":")
		out[i] = job.NodeView{ID: id, Pool: "default", JobID: job.RunJobID(run, id, 1), State: st, Round: 1}
		if after != "" {
			out[i].After = strings.Split(after, ",")
		}
	}
	return out
}

// placed lists each node as id@layer.row, in the run's order.
func placed(nodes []job.NodeView, l *layout) string {
	var parts []string
	for i, nd := range nodes {
		parts = append(parts, fmt.Sprintf("%s@%d.%d", nd.ID, l.Layer[i], l.Row[i]))
	}
	return strings.Join(parts, " ")
}

func edgesOf(nodes []job.NodeView, l *layout) string {
	var parts []string
	for _, e := range l.Edges {
		parts = append(parts, nodes[e[0]].ID+">"+nodes[e[1]].ID)
	}
	return strings.Join(parts, " ")
}

// TestLayOutPlacesNodesByTheLongestPathFromARoot: a node's layer is the
// longest path to it from a root, whatever order the run lists its nodes
// in; in a layer, a node goes near its parents; every edge is drawn once,
// from parent to child.
func TestLayOutPlacesNodesByTheLongestPathFromARoot(t *testing.T) {
	for _, tc := range []struct {
		name         string
		specs        []string
		place, edges string
		layers       int
	}{
		{name: "diamond", specs: []string{"a", "b:a", "c:a", "d:b,c"},
			place: "a@0.0 b@1.0 c@1.1 d@2.0", edges: "a>b a>c b>d c>d", layers: 3},
		{name: "diamond listed backwards", specs: []string{"d:b,c", "c:a", "b:a", "a"},
			place: "d@2.0 c@1.0 b@1.1 a@0.0", edges: "b>d c>d a>c a>b", layers: 3},
		{name: "fan-out and in", specs: []string{"root", "x1:root", "x2:root", "x3:root", "x4:root", "join:x1,x2,x3,x4"},
			place: "root@0.0 x1@1.0 x2@1.1 x3@1.2 x4@1.3 join@2.0",
			edges: "root>x1 root>x2 root>x3 root>x4 x1>join x2>join x3>join x4>join", layers: 3},
		{name: "chain", specs: []string{"n0", "n1:n0", "n2:n1", "n3:n2", "n4:n3"},
			place: "n0@0.0 n1@1.0 n2@2.0 n3@3.0 n4@4.0", edges: "n0>n1 n1>n2 n2>n3 n3>n4", layers: 5},
		// c comes after a directly and through b: the longer path counts.
		{name: "a skip", specs: []string{"a", "b:a", "c:a,b"},
			place: "a@0.0 b@1.0 c@2.0", edges: "a>b a>c b>c", layers: 3},
		{name: "a skip, the long way named first", specs: []string{"a", "b:a", "c:b,a"},
			place: "a@0.0 b@1.0 c@2.0", edges: "a>b b>c a>c", layers: 3},
		// Children go in the order of their parents' rows, not the run's.
		{name: "crossings", specs: []string{"p", "q", "cq:q", "cp:p"},
			place: "p@0.0 q@0.1 cq@1.1 cp@1.0", edges: "q>cq p>cp", layers: 2},
		{name: "two roots", specs: []string{"a", "b", "c:a,b"},
			place: "a@0.0 b@0.1 c@1.0", edges: "a>c b>c", layers: 2},
		{name: "one node", specs: []string{"only"}, place: "only@0.0", layers: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := graphOf("r", job.NodeWaiting, tc.specs...)
			l := layOut(nodes)
			if got := placed(nodes, l); got != tc.place {
				t.Errorf("placed %s, want %s", got, tc.place)
			}
			if got := edgesOf(nodes, l); got != tc.edges {
				t.Errorf("edges %s, want %s", got, tc.edges)
			}
			if len(l.Layers) != tc.layers || l.summarised() {
				t.Errorf("%d layers (summarised %t), want %d drawn by node", len(l.Layers), l.summarised(), tc.layers)
			}
		})
	}
}

var (
	nodeTag = regexp.MustCompile(`<(a|g) class="node s-([a-z_]+)"( href="([^"]*)")? data-node="([^"]+)" data-state="([a-z_]+)" data-layer="(\d+)" data-row="(\d+)"`)
	edgeTag = regexp.MustCompile(`<path class="edge" data-from="([^"]+)" data-to="([^"]+)"`)
)

// TestDrawNodesBoxesEachNodeByState: a diamond drawn one box a node:
// each box in its layer, coloured and marked by its state, linked to its
// job's page (its id has a colon) unless it has no job yet, its failure
// code and what it waits for in its tooltip; an edge a pair.
func TestDrawNodesBoxesEachNodeByState(t *testing.T) {
	nodes := graphOf("dia", job.StateSucceeded, "a", "b:a", "c:a", "d:b,c")
	nodes[1].State, nodes[1].Code = job.StateFailed, job.CodeExitCode
	nodes[2].State = job.StateRunning
	nodes[3].State, nodes[3].WaitingFor = job.NodeWaiting, []string{"c"}
	l := layOut(nodes)
	svg := string(drawNodes(l, nodes, func(nd job.NodeView) string { return "/ui/jobs/default/" + nd.Pool + "/" + nd.JobID }))
	type box struct{ tag, class, href, state, layer string }
	got := map[string]box{}
	for _, m := range nodeTag.FindAllStringSubmatch(svg, -1) {
		got[m[5]] = box{m[1], m[2], m[4], m[6], m[7]}
	}
	want := map[string]box{
		"a": {"a", "succeeded", "/ui/jobs/default/default/dia:a", "succeeded", "0"},
		"b": {"a", "failed", "/ui/jobs/default/default/dia:b", "failed", "1"},
		"c": {"a", "running", "/ui/jobs/default/default/dia:c", "running", "1"},
		"d": {"g", "waiting", "", "waiting", "2"}, // no job yet: no link
	}
	if len(got) != len(want) {
		t.Fatalf("%d boxes, want %d:\n%s", len(got), len(want), svg)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("node %s: %+v, want %+v", id, got[id], w)
		}
	}
	var edges []string
	for _, m := range edgeTag.FindAllStringSubmatch(svg, -1) {
		edges = append(edges, m[1]+">"+m[2])
	}
	if !slices.Equal(edges, []string{"a>b", "a>c", "b>d", "c>d"}) {
		t.Errorf("edges %v", edges)
	}
	for _, s := range []string{`<title>node b · failed · exit_code · job dia:b</title>`, `<title>node d · waiting · waiting for c</title>`,
		`data-code="exit_code"`, `>failed · exit_code</text>`} {
		if !strings.Contains(svg, s) {
			t.Errorf("the drawing has no %s", s)
		}
	}
	// Boxes of one layer share a column; the next layer is to the right.
	x := func(id string) int {
		m := regexp.MustCompile(`data-node="` + id + `"[^>]*><title>[^<]*</title><rect x="(\d+)"`).FindStringSubmatch(svg)
		if m == nil {
			t.Fatalf("no box of %s", id)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if !(x("a") < x("b") && x("b") == x("c") && x("c") < x("d")) {
		t.Errorf("columns: a %d, b %d, c %d, d %d", x("a"), x("b"), x("c"), x("d"))
	}
}

// TestDrawNodesEscapes: what a view says is escaped, whatever it holds.
func TestDrawNodesEscapes(t *testing.T) {
	nodes := []job.NodeView{{ID: `x"><script>`, JobID: `r:x"`, Pool: "p", State: job.StateFailed, Code: `<b>`}}
	svg := string(drawNodes(layOut(nodes), nodes, func(nd job.NodeView) string { return "/ui/jobs/t/p/" + nd.JobID }))
	if strings.Contains(svg, "<script>") || strings.Contains(svg, "<b>") || strings.Contains(svg, `x">`) {
		t.Errorf("not escaped: %s", svg)
	}
}

// fanOut is a run of a root and n nodes after it.
func fanOut(n int) []job.NodeView {
	specs := []string{"root"}
	for i := range n {
		specs = append(specs, fmt.Sprintf("leaf-%05d:root", i))
	}
	return graphOf("big", job.StateSucceeded, specs...)
}

// TestARunAboveTheThresholdIsDrawnByLayers: up to maxDrawnNodes nodes a
// run is drawn by node; above, by layer, a box a layer with its nodes
// counted by state; a chain longer than maxBands layers shares boxes
// between consecutive layers, so that the drawing stays the same size.
func TestARunAboveTheThresholdIsDrawnByLayers(t *testing.T) {
	if l := layOut(fanOut(maxDrawnNodes - 1)); l.summarised() {
		t.Errorf("%d nodes drawn by layers", maxDrawnNodes)
	}
	nodes := fanOut(maxDrawnNodes)
	for i := 1; i < len(nodes); i++ {
		switch {
		case i%10 == 0:
			nodes[i].State, nodes[i].Code = job.StateCancelled, job.CodeUpstreamFailed
		case i%3 == 0:
			nodes[i].State = job.StateRunning
		}
	}
	l := layOut(nodes)
	if !l.summarised() {
		t.Fatalf("%d nodes drawn by node", len(nodes))
	}
	svg := string(drawBands(l, nodes))
	if strings.Contains(svg, "data-node=") {
		t.Error("a run drawn by layers has a box of a node")
	}
	bands := regexp.MustCompile(`<g class="band" data-band="(\d+)" data-first="(\d+)" data-last="(\d+)" data-nodes="(\d+)">`).FindAllStringSubmatch(svg, -1)
	if len(bands) != 2 || bands[0][4] != "1" || bands[1][4] != "300" || bands[1][2] != "1" || bands[1][3] != "1" {
		t.Fatalf("bands %v", bands)
	}
	// 300 leaves: 30 cancelled, 90 running (every third, but not the tenth), 180 succeeded.
	segs := regexp.MustCompile(`<rect class="seg s-[a-z_]+" data-state="([a-z_]+)" data-count="(\d+)"`).FindAllStringSubmatch(svg, -1)
	var counts []string
	for _, m := range segs {
		counts = append(counts, m[1]+"="+m[2])
	}
	if !slices.Equal(counts, []string{"succeeded=1", "running=90", "succeeded=180", "cancelled=30"}) {
		t.Errorf("the bands' counts: %v", counts)
	}
	if !strings.Contains(svg, "<title>layer 1: 300 nodes: 90 running, 180 succeeded, 30 cancelled</title>") {
		t.Error("the leaves' band does not say its counts")
	}
	if e := edgeTag.FindAllStringSubmatch(svg, -1); len(e) != 1 || e[0][1] != "0" || e[0][2] != "1" ||
		!strings.Contains(svg, "<title>300 edges</title>") {
		t.Errorf("edges between bands: %v", e)
	}

	// A chain of 10,000: 50 boxes of 200 layers, an edge between each two
	// in a row.
	specs := []string{"c00000"}
	for i := 1; i < 10_000; i++ {
		specs = append(specs, fmt.Sprintf("c%05d:c%05d", i, i-1))
	}
	chain := graphOf("chain", job.StateQueued, specs...)
	l = layOut(chain)
	if len(l.Layers) != 10_000 {
		t.Fatalf("a chain of 10,000 in %d layers", len(l.Layers))
	}
	svg = string(drawBands(l, chain))
	bands = regexp.MustCompile(`<g class="band" data-band="(\d+)" data-first="(\d+)" data-last="(\d+)" data-nodes="(\d+)">`).FindAllStringSubmatch(svg, -1)
	if len(bands) != maxBands || bands[1][2] != "200" || bands[1][3] != "399" || bands[49][4] != "200" {
		t.Errorf("%d bands, the second %v, the last %v", len(bands), bands[1], bands[len(bands)-1])
	}
	if e := edgeTag.FindAllStringSubmatch(svg, -1); len(e) != maxBands-1 {
		t.Errorf("%d edges between the chain's bands, want %d", len(e), maxBands-1)
	}
	if len(svg) > 100_000 {
		t.Errorf("the drawing of a chain of 10,000 is %d bytes", len(svg))
	}
}

// TestManyEdgesAreDrawnByLayers: fewer nodes than the threshold, but more
// edges than a drawing can show, are drawn by layers too.
func TestManyEdgesAreDrawnByLayers(t *testing.T) {
	var specs, layer0 []string
	for i := range 60 {
		specs = append(specs, fmt.Sprintf("a%d", i))
		layer0 = append(layer0, fmt.Sprintf("a%d", i))
	}
	for i := range 60 {
		specs = append(specs, fmt.Sprintf("b%d:%s", i, strings.Join(layer0, ",")))
	}
	l := layOut(graphOf("dense", job.StateQueued, specs...))
	if len(l.Edges) != 3600 || !l.summarised() {
		t.Errorf("%d edges, summarised %t", len(l.Edges), l.summarised())
	}
}

// TestCountStatesInOrder: counts by state, in the order the pages show
// them, states none is in left out.
func TestCountStatesInOrder(t *testing.T) {
	nodes := graphOf("r", job.StateSucceeded, "a", "b", "c", "d", "e")
	nodes[0].State, nodes[2].State, nodes[4].State = job.StateFailed, job.NodeWaiting, job.StateFailed
	got := countStates(nodes, nil)
	want := []stateCount{{job.NodeWaiting, 1}, {job.StateSucceeded, 2}, {job.StateFailed, 2}}
	if !slices.Equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
	if got := countStates(nodes, []int{0, 1}); !slices.Equal(got, []stateCount{{job.StateSucceeded, 1}, {job.StateFailed, 1}}) {
		t.Errorf("of a and b: %v", got)
	}
}

// TestEdgesThatSkipLayersRunOverTheBoxes: an edge that skips layers runs
// in a lane above every box, not behind the boxes between its ends;
// edges whose spans meet take lanes of their own, the others share one.
func TestEdgesThatSkipLayersRunOverTheBoxes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		specs []string
		lanes string
	}{
		{"spans that meet", []string{"a", "b:a", "c:b", "d:c", "e:a,d", "f:b,c", "g:c,d"}, "a>e=0 b>f=1 c>g=2"},
		{"spans that do not", []string{"p", "q:p", "r:q", "s:p,r", "t:s", "u:t", "v:s,u"}, "p>s=0 s>v=0"},
		{"none", []string{"a", "b:a", "c:a", "d:b,c"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := graphOf("r", job.StateSucceeded, tc.specs...)
			svg := string(drawNodes(layOut(nodes), nodes, func(job.NodeView) string { return "" }))
			var lanes []string
			for _, m := range regexp.MustCompile(`class="edge skip" data-from="([^"]+)" data-to="([^"]+)" data-lane="(\d+)"`).FindAllStringSubmatch(svg, -1) {
				lanes = append(lanes, m[1]+">"+m[2]+"="+m[3])
			}
			if got := strings.Join(lanes, " "); got != tc.lanes {
				t.Errorf("lanes %q, want %q", got, tc.lanes)
			}
			// Every point of a skipping edge's lane is above every box.
			lowestLane, topBox := 0, 1<<30
			for _, m := range regexp.MustCompile(`class="edge skip"[^>]* d="M\d+ \d+ H\d+ Q\d+ \d+ \d+ \d+ V(\d+)`).FindAllStringSubmatch(svg, -1) {
				n, _ := strconv.Atoi(m[1])
				lowestLane = max(lowestLane, n)
			}
			for _, m := range regexp.MustCompile(`<rect x="\d+" y="(\d+)"`).FindAllStringSubmatch(svg, -1) {
				n, _ := strconv.Atoi(m[1])
				topBox = min(topBox, n)
			}
			if lowestLane >= topBox {
				t.Errorf("a lane at %d, not above the boxes from %d", lowestLane, topBox)
			}
		})
	}
}
