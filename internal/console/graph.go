package console

// A run's graph, laid out and drawn as SVG on the server: no script, no
// library. Each node goes in a layer, the longest path to it from a root
// (a node that comes after none), and layers are columns, left to right,
// so that every edge points right. A run of up to maxDrawnNodes nodes is
// drawn one box a node, linked to its job's page; a larger one is drawn
// one box a band of layers, with its nodes counted by state, so that the
// page stays the same size whatever the run's.

import (
	"cmp"
	"fmt"
	"html"
	"html/template"
	"maps"
	"slices"
	"strings"

	"github.com/fleet-dev/fleet/job"
)

// Bounds of the drawing.
const (
	// maxDrawnNodes and maxDrawnEdges bound a run drawn one box a node;
	// above either, its layers are drawn as boxes of counts.
	maxDrawnNodes = 300
	maxDrawnEdges = 3000
	// maxBands bounds the boxes of a run drawn by layers: consecutive
	// layers share a box when there are more (a long chain).
	maxBands = 50
	// maxLanes bounds the lanes over the boxes that the edges that skip
	// layers run in.
	maxLanes = 16
)

// layout is where a run's nodes go: each node's layer and row, and the
// edges between them. It depends on the graph only, which a run never
// changes, so it is made once a run.
type layout struct {
	// Layer and Row are each node's, by its index in the run.
	Layer, Row []int
	// Layers lists each layer's nodes, in the order they are drawn.
	Layers [][]int
	// Parents lists each node's parents (the nodes it comes after).
	Parents [][]int
	// Edges are the graph's, parent then child, by the children's order.
	Edges [][2]int
}

// layOut places the nodes of a run. A node's layer is the longest path
// to it from a root; in its layer, nodes are ordered by the mean row of
// their parents (fewer crossings), then by their order in the run. Nodes
// named after nodes the run does not have are taken for roots.
func layOut(nodes []job.NodeView) *layout {
	n := len(nodes)
	l := &layout{Layer: make([]int, n), Row: make([]int, n), Parents: make([][]int, n)}
	index := make(map[string]int, n)
	for i, nd := range nodes {
		index[nd.ID] = i
	}
	req := &job.RunRequest{Nodes: make([]job.RunNode, n)}
	for i, nd := range nodes {
		req.Nodes[i].ID = nd.ID
		for _, p := range nd.After {
			if j, ok := index[p]; ok {
				l.Parents[i] = append(l.Parents[i], j)
				req.Nodes[i].After = append(req.Nodes[i].After, p)
			}
		}
	}
	// A run has no cycle (the dispatcher refuses one); should a view have
	// one anyway, its nodes that Order leaves out go in the first layer.
	order := req.Order()
	for _, i := range order {
		for _, p := range l.Parents[i] {
			l.Layer[i] = max(l.Layer[i], l.Layer[p]+1)
		}
	}
	layers := 0
	for _, x := range l.Layer {
		layers = max(layers, x+1)
	}
	l.Layers = make([][]int, layers)
	for i := range nodes {
		l.Layers[l.Layer[i]] = append(l.Layers[l.Layer[i]], i)
	}
	for x, layer := range l.Layers {
		if x > 0 {
			mean := make(map[int]float64, len(layer))
			for _, i := range layer {
				sum := 0
				for _, p := range l.Parents[i] {
					sum += l.Row[p]
				}
				mean[i] = float64(sum) / float64(max(1, len(l.Parents[i])))
			}
			slices.SortStableFunc(layer, func(a, b int) int { return cmp.Or(cmp.Compare(mean[a], mean[b]), cmp.Compare(a, b)) })
		}
		for r, i := range layer {
			l.Row[i] = r
		}
	}
	for i := range nodes {
		for _, p := range l.Parents[i] {
			l.Edges = append(l.Edges, [2]int{p, i})
		}
	}
	return l
}

// summarised reports whether the run is drawn by layers, not by node.
func (l *layout) summarised() bool {
	return len(l.Layer) > maxDrawnNodes || len(l.Edges) > maxDrawnEdges
}

// band is a box of a run drawn by layers: its layers First to Last, and
// their nodes.
type band struct {
	First, Last int
	Nodes       []int
}

// bands groups the layers into at most max boxes of consecutive layers,
// as many layers to a box.
func (l *layout) bands(max int) []band {
	per := (len(l.Layers) + max - 1) / max
	per = cmp.Or(per, 1)
	var out []band
	for first := 0; first < len(l.Layers); first += per {
		b := band{First: first, Last: min(first+per, len(l.Layers)) - 1}
		for x := b.First; x <= b.Last; x++ {
			b.Nodes = append(b.Nodes, l.Layers[x]...)
		}
		out = append(out, b)
	}
	return out
}

// bandEdges counts the edges between bands (of per layers each), from
// band to band: a pair for each pair of bands that has one.
func (l *layout) bandEdges(per int) map[[2]int]int {
	out := map[[2]int]int{}
	for _, e := range l.Edges {
		from, to := l.Layer[e[0]]/per, l.Layer[e[1]]/per
		if from != to {
			out[[2]int{from, to}]++
		}
	}
	return out
}

// States in the order a run's counts show them.
var nodeStates = []job.State{job.NodeWaiting, job.StateQueued, job.StateRunning, job.StateRetrying, job.StateSucceeded,
	job.StateFailed, job.StateTimedOut, job.StateCancelled, job.StateRejected}

// stateCount is how many of a run's nodes are in a state.
type stateCount struct {
	State job.State
	N     int
}

// countStates counts the nodes of list (all of them, when list is nil)
// by state, in the order of nodeStates, leaving out states none is in.
func countStates(nodes []job.NodeView, list []int) []stateCount {
	by := map[job.State]int{}
	if list == nil {
		for _, nd := range nodes {
			by[nd.State]++
		}
	} else {
		for _, i := range list {
			by[nodes[i].State]++
		}
	}
	var out []stateCount
	for _, s := range nodeStates {
		if by[s] > 0 {
			out = append(out, stateCount{s, by[s]})
			delete(by, s)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(by)) { // a state of a later version
		out = append(out, stateCount{s, by[s]})
	}
	return out
}

// Sizes of the drawing, in pixels.
const (
	boxW, boxH   = 184, 44
	colGap       = 64
	rowGap       = 14
	pad          = 12
	laneGap      = 8
	bandW, bandH = 220, 74
	bandGap      = 56
	bandSkipTop  = 70 // room above the bands for the edges that skip some
	idChars      = 22 // the characters of a node's id a box shows
)

// drawNodes draws a run one box a node: its id, state and failure code,
// coloured by state, linked to its job's page once it has a job (path
// gives the page), with a tooltip that says what it waits for.
func drawNodes(l *layout, nodes []job.NodeView, path func(job.NodeView) string) template.HTML {
	rows := 0
	for _, layer := range l.Layers {
		rows = max(rows, len(layer))
	}
	lane, lanes := skipLanes(l)
	// The lanes run above the boxes, with a row's gap under the lowest.
	top := pad
	if lanes > 0 {
		top += lanes*laneGap + rowGap
	}
	w := 2*pad + len(l.Layers)*boxW + max(0, len(l.Layers)-1)*colGap
	h := top + pad + rows*boxH + max(0, rows-1)*rowGap
	x := func(i int) int { return pad + l.Layer[i]*(boxW+colGap) }
	y := func(i int) int {
		// Each layer is centred on the tallest.
		off := (rows - len(l.Layers[l.Layer[i]])) * (boxH + rowGap) / 2
		return top + off + l.Row[i]*(boxH+rowGap)
	}
	var b strings.Builder
	b.Grow(600*len(nodes) + 120*len(l.Edges))
	fmt.Fprintf(&b, `<svg class="graph" id="graph-svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="the run's graph: %d nodes in %d layers">`,
		w, h, w, h, len(nodes), len(l.Layers))
	b.WriteString(`<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
		`<path d="M0 0 L8 4 L0 8 z"/></marker></defs><g class="edges">`)
	for k, e := range l.Edges {
		x1, y1 := x(e[0])+boxW, y(e[0])+boxH/2
		x2, y2 := x(e[1]), y(e[1])+boxH/2
		from, to := html.EscapeString(nodes[e[0]].ID), html.EscapeString(nodes[e[1]].ID)
		if lane[k] < 0 {
			dx := (x2 - x1) / 2
			fmt.Fprintf(&b, `<path class="edge" data-from="%s" data-to="%s" d="M%d %d C%d %d %d %d %d %d" marker-end="url(#arrow)"/>`,
				from, to, x1, y1, x1+dx, y1, x2-dx, y2, x2, y2)
			continue
		}
		// Up in the gap after the parent's column, along its lane over
		// the boxes, and down in the gap before the child's.
		ly := pad + lane[k]*laneGap
		g1, g2 := x1+colGap/2, x2-colGap/2
		const r = 6
		fmt.Fprintf(&b, `<path class="edge skip" data-from="%s" data-to="%s" data-lane="%d" d="M%d %d H%d Q%d %d %d %d V%d Q%d %d %d %d H%d Q%d %d %d %d V%d Q%d %d %d %d H%d" marker-end="url(#arrow)"/>`,
			from, to, lane[k], x1, y1, g1-r, g1, y1, g1, y1-r, ly+r, g1, ly, g1+r, ly, g2-r, g2, ly, g2, ly+r, y2-r, g2, y2, g2+r, y2, x2)
	}
	b.WriteString(`</g><g class="nodes">`)
	for i, nd := range nodes {
		st := string(nd.State)
		tag, href := "g", ""
		if p := path(nd); p != "" && nd.State != job.NodeWaiting {
			tag, href = "a", fmt.Sprintf(` href="%s"`, html.EscapeString(p))
		}
		fmt.Fprintf(&b, `<%s class="node s-%s"%s data-node="%s" data-state="%s" data-layer="%d" data-row="%d"`, tag, html.EscapeString(st), href,
			html.EscapeString(nd.ID), html.EscapeString(st), l.Layer[i], l.Row[i])
		if nd.Code != "" {
			fmt.Fprintf(&b, ` data-code="%s"`, html.EscapeString(string(nd.Code)))
		}
		b.WriteString(`><title>`)
		b.WriteString(html.EscapeString(nodeTitle(nd)))
		fmt.Fprintf(&b, `</title><rect x="%d" y="%d" width="%d" height="%d" rx="6"/>`, x(i), y(i), boxW, boxH)
		fmt.Fprintf(&b, `<text class="id" x="%d" y="%d">%s</text>`, x(i)+10, y(i)+18, html.EscapeString(clip(nd.ID, idChars)))
		label := st
		if nd.Code != "" {
			label += " · " + string(nd.Code)
		}
		fmt.Fprintf(&b, `<text class="st" x="%d" y="%d">%s</text></%s>`, x(i)+10, y(i)+35, html.EscapeString(clip(label, idChars+4)), tag)
	}
	b.WriteString(`</g></svg>`)
	return template.HTML(b.String())
}

// skipLanes gives each edge that skips layers a lane over the boxes, and
// -1 to the others: edges whose spans do not meet share a lane; past
// maxLanes, lanes are shared anyway.
func skipLanes(l *layout) (lane []int, lanes int) {
	lane = make([]int, len(l.Edges))
	var skips []int
	for k, e := range l.Edges {
		lane[k] = -1
		if l.Layer[e[1]]-l.Layer[e[0]] > 1 {
			skips = append(skips, k)
		}
	}
	span := func(k int) (int, int) { return l.Layer[l.Edges[k][0]], l.Layer[l.Edges[k][1]] }
	slices.SortStableFunc(skips, func(a, b int) int {
		a0, a1 := span(a)
		b0, b1 := span(b)
		return cmp.Or(cmp.Compare(a0, b0), cmp.Compare(a1, b1))
	})
	var ends []int // the last layer each lane reaches
	for n, k := range skips {
		first, last := span(k)
		free := slices.IndexFunc(ends, func(end int) bool { return end <= first })
		switch {
		case free >= 0:
		case len(ends) < maxLanes:
			free = len(ends)
			ends = append(ends, 0)
		default:
			free = n % maxLanes
		}
		lane[k], ends[free] = free, max(ends[free], last)
	}
	return lane, len(ends)
}

// nodeTitle is a node's tooltip.
func nodeTitle(nd job.NodeView) string {
	t := "node " + nd.ID + " · " + string(nd.State)
	if nd.Code != "" {
		t += " · " + string(nd.Code)
	}
	if nd.JobID != "" && nd.State != job.NodeWaiting {
		t += " · job " + nd.JobID
	}
	if nd.Round > 1 {
		t += fmt.Sprintf(" · round %d", nd.Round)
	}
	if len(nd.WaitingFor) > 0 {
		t += " · waiting for " + strings.Join(nd.WaitingFor, ", ")
	}
	if w := nd.When.Or(); len(nd.After) > 0 && w != job.WhenAllSucceeded {
		t += " · when " + string(w)
	}
	return t
}

// clip shortens s to n characters, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// drawBands draws a run by layers: a box a band of layers, with its
// nodes counted by state as a bar and in words, and an edge from a box
// to another for the edges between their nodes (over the boxes when it
// skips some).
func drawBands(l *layout, nodes []job.NodeView) template.HTML {
	bands := l.bands(maxBands)
	per := 1
	if len(bands) > 0 {
		per = bands[0].Last - bands[0].First + 1
	}
	edges := l.bandEdges(per)
	// Room above the boxes for the edges that skip some, if any does.
	bandTop := pad
	for p := range edges {
		if p[1] > p[0]+1 {
			bandTop = bandSkipTop
		}
	}
	w := 2*pad + len(bands)*bandW + max(0, len(bands)-1)*bandGap
	h := bandTop + bandH + pad
	x := func(k int) int { return pad + k*(bandW+bandGap) }
	var b strings.Builder
	b.Grow(800*len(bands) + 200*len(edges))
	fmt.Fprintf(&b, `<svg class="graph bands" id="graph-svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="the run's graph by layers: %d nodes in %d layers">`,
		w, h, w, h, len(nodes), len(l.Layers))
	b.WriteString(`<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
		`<path d="M0 0 L8 4 L0 8 z"/></marker></defs><g class="edges">`)
	pairs := make([][2]int, 0, len(edges))
	for p := range edges {
		pairs = append(pairs, p)
	}
	slices.SortFunc(pairs, func(a, b [2]int) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	for _, p := range pairs {
		n := edges[p]
		var d string
		if p[1] == p[0]+1 {
			y := bandTop + bandH/2
			d = fmt.Sprintf("M%d %d L%d %d", x(p[0])+bandW, y, x(p[1]), y)
		} else {
			// Over the boxes between: higher the more it skips.
			x1, x2 := x(p[0])+bandW/2, x(p[1])+bandW/2
			top := max(4, bandTop-12-6*(p[1]-p[0]))
			d = fmt.Sprintf("M%d %d C%d %d %d %d %d %d", x1, bandTop, x1, top, x2, top, x2, bandTop)
		}
		fmt.Fprintf(&b, `<path class="edge" data-from="%d" data-to="%d" d="%s" marker-end="url(#arrow)"><title>%d edge%s</title></path>`,
			p[0], p[1], d, n, plural(n))
	}
	b.WriteString(`</g><g class="nodes">`)
	for k, bd := range bands {
		counts := countStates(nodes, bd.Nodes)
		name := fmt.Sprintf("layer %d", bd.First)
		if bd.Last > bd.First {
			name = fmt.Sprintf("layers %d–%d", bd.First, bd.Last)
		}
		var words []string
		for _, c := range counts {
			words = append(words, fmt.Sprintf("%d %s", c.N, c.State))
		}
		fmt.Fprintf(&b, `<g class="band" data-band="%d" data-first="%d" data-last="%d" data-nodes="%d"><title>%s: %d node%s: %s</title>`,
			k, bd.First, bd.Last, len(bd.Nodes), name, len(bd.Nodes), plural(len(bd.Nodes)), html.EscapeString(strings.Join(words, ", ")))
		fmt.Fprintf(&b, `<rect class="box" x="%d" y="%d" width="%d" height="%d" rx="6"/>`, x(k), bandTop, bandW, bandH)
		fmt.Fprintf(&b, `<text class="id" x="%d" y="%d">%s · %d node%s</text>`, x(k)+10, bandTop+18, name, len(bd.Nodes), plural(len(bd.Nodes)))
		// The bar: a segment a state, as wide as its share.
		bx, bw := x(k)+10, bandW-20
		at := 0
		for _, c := range counts {
			from, to := bx+at*bw/len(bd.Nodes), bx+(at+c.N)*bw/len(bd.Nodes)
			at += c.N
			fmt.Fprintf(&b, `<rect class="seg s-%s" data-state="%s" data-count="%d" x="%d" y="%d" width="%d" height="10"/>`,
				html.EscapeString(string(c.State)), html.EscapeString(string(c.State)), c.N, from, bandTop+27, max(1, to-from))
		}
		line := strings.Join(words, " · ")
		fmt.Fprintf(&b, `<text class="st" x="%d" y="%d">%s</text></g>`, x(k)+10, bandTop+58, html.EscapeString(clip(line, 34)))
	}
	b.WriteString(`</g></svg>`)
	return template.HTML(b.String())
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
