// Command runs-bench times a graph of no-op jobs through a fleet three
// ways, speaking only the fleet's documented NATS subjects:
//
//   - run: the graph submitted as one run (fleet.t.<tenant>.runs.submit),
//     its nodes released by the fleet as their parents end;
//   - planner: a planner outside the fleet, as before runs: it submits
//     each node as a job (fleet.t.<tenant>.submit) when it has heard the
//     final versions of the nodes it comes after;
//   - jobs: the same number of jobs with no edges, submitted at once: the
//     rate the graph is held to.
//
// Two shapes: fan, one node, then nodes-2 after it, then one after them
// all; and chain, each node after the one before, on an idle pool, where
// the time from a parent's end (its final version's finished_at) to its
// child's start (the child's started_at) is the release's latency. The
// report is one line of JSON.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

type report struct {
	Via            string  `json:"via"`
	Shape          string  `json:"shape"`
	Nodes          int     `json:"nodes"`
	Seconds        float64 `json:"seconds"`
	NodesPerSecond float64 `json:"nodes_per_second"`
	Failed         int     `json:"failed"`
	Missing        int     `json:"missing"`
	// From a parent's finished_at to its child's started_at, over every
	// edge of a chain.
	ReleaseP50Ms float64 `json:"release_p50_ms,omitempty"`
	ReleaseP99Ms float64 `json:"release_p99_ms,omitempty"`
	// Phases of a fan, in ms from the submission: the first node's start
	// and end, the first and last start of the nodes after it, the last
	// end of those, and the last node's start.
	Phases map[string]float64 `json:"phases_ms,omitempty"`
}

// record is what the bench reads of a final version.
type record struct {
	ID         string     `json:"id"`
	State      string     `json:"state"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// graph is a shape of nodes: parents[i] are the nodes i comes after.
type graph struct {
	ids     []string
	parents [][]int
}

func shape(name string, n int) (*graph, error) {
	g := &graph{ids: make([]string, n), parents: make([][]int, n)}
	for i := range n {
		g.ids[i] = "n" + strconv.Itoa(i)
	}
	switch name {
	case "fan":
		if n < 3 {
			return nil, fmt.Errorf("a fan needs 3 nodes or more")
		}
		last := make([]int, 0, n-2)
		for i := 1; i < n-1; i++ {
			g.parents[i] = []int{0}
			last = append(last, i)
		}
		g.parents[n-1] = last
	case "chain":
		for i := 1; i < n; i++ {
			g.parents[i] = []int{i - 1}
		}
	case "none":
	default:
		return nil, fmt.Errorf("unknown shape %q: fan, chain or none", name)
	}
	return g, nil
}

func main() {
	url := flag.String("nats", nats.DefaultURL, "the fleet's NATS URL")
	tenant := flag.String("tenant", "default", "the tenant whose subjects the bench uses")
	pool := flag.String("pool", "default", "the pool of the jobs")
	via := flag.String("via", "run", "run, planner or jobs")
	shapeName := flag.String("shape", "fan", "fan (1 -> nodes-2 -> 1) or chain")
	n := flag.Int("nodes", 10000, "nodes of the graph")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()

	g, err := shape(*shapeName, *n)
	if *via == "jobs" {
		g, err = shape("none", *n)
	}
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(*url, nats.Name("runs-bench"))
	if err != nil {
		log.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	b := &bench{nc: nc, tenant: *tenant, pool: *pool, g: g, tag: fmt.Sprintf("rb%08x", rand.Uint32()),
		ended: make([]*record, *n), pending: make([]int, *n), children: make([][]int, *n), done: make(chan struct{})}
	for i, ps := range g.parents {
		b.pending[i] = len(ps)
		for _, p := range ps {
			b.children[p] = append(b.children[p], i)
		}
	}
	r, err := b.run(*via, *timeout)
	if err != nil {
		log.Fatal(err)
	}
	r.Via, r.Shape = *via, *shapeName
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

type bench struct {
	nc           *nats.Conn
	tenant, pool string
	g            *graph
	tag          string

	mu       sync.Mutex
	ended    []*record
	count    int
	pending  []int // per node, its parents not ended yet (the planner's)
	children [][]int
	planner  bool
	accepted time.Duration // from the submission to the run's answer
	inbox    string
	bodies   map[int][]byte
	done     chan struct{}
}

// jobID is node i's job's id: a run's node's is <run>:<node>; the
// planner's and the independent jobs' are their own.
func (b *bench) jobID(i int, run bool) string {
	if run {
		return b.tag + ":" + b.g.ids[i]
	}
	return b.tag + "-" + b.g.ids[i]
}

func (b *bench) node(id string) int {
	_, node, ok := strings.Cut(id, ":")
	if !ok {
		_, node, ok = strings.Cut(id, "-")
	}
	if !ok || len(node) < 2 {
		return -1
	}
	i, err := strconv.Atoi(node[1:])
	if err != nil || i < 0 || i >= len(b.g.ids) {
		return -1
	}
	return i
}

func (b *bench) run(via string, timeout time.Duration) (*report, error) {
	// A final version is republished on fleet.t.<tenant>.job.<pool>.r.<id>;
	// the ids, <tag>:<node> and <tag>-<node>, are one token each.
	sub, err := b.nc.Subscribe("fleet.t."+b.tenant+".job.*.r.*", b.result)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	_ = sub.SetPendingLimits(-1, -1)
	b.inbox = b.nc.NewRespInbox()
	ans, err := b.nc.Subscribe(b.inbox+".>", b.answer)
	if err != nil {
		return nil, err
	}
	defer ans.Unsubscribe()
	_ = ans.SetPendingLimits(-1, -1)
	if err := b.nc.Flush(); err != nil {
		return nil, err
	}
	b.bodies = map[int][]byte{}

	begin := time.Now()
	switch via {
	case "run":
		if err := b.submitRun(); err != nil {
			return nil, err
		}
		b.accepted = time.Since(begin)
	case "planner", "jobs":
		b.mu.Lock()
		b.planner = true
		var roots []int
		for i, p := range b.pending {
			if p == 0 {
				roots = append(roots, i)
			}
		}
		err := b.submit(roots)
		b.mu.Unlock()
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown --via %q: run, planner or jobs", via)
	}
	select {
	case <-b.done:
	case <-time.After(timeout):
	}
	elapsed := time.Since(begin)

	b.mu.Lock()
	defer b.mu.Unlock()
	r := &report{Nodes: len(b.g.ids), Seconds: elapsed.Seconds(), NodesPerSecond: float64(b.count) / elapsed.Seconds(),
		Missing: len(b.g.ids) - b.count}
	var gaps []time.Duration
	for i, rec := range b.ended {
		if rec == nil {
			continue
		}
		if rec.State != "succeeded" {
			r.Failed++
		}
		for _, p := range b.g.parents[i] {
			if pr := b.ended[p]; len(b.g.parents[i]) == 1 && pr != nil && pr.FinishedAt != nil && rec.StartedAt != nil {
				gaps = append(gaps, rec.StartedAt.Sub(*pr.FinishedAt))
			}
		}
	}
	if n := len(b.g.ids); b.count == n && len(b.g.parents[n-1]) == n-2 && n > 2 {
		ms := func(t *time.Time) float64 { return float64(t.Sub(begin).Microseconds()) / 1000 }
		r.Phases = map[string]float64{"first_started": ms(b.ended[0].StartedAt), "first_ended": ms(b.ended[0].FinishedAt),
			"last_started": ms(b.ended[n-1].StartedAt), "accepted": float64(b.accepted.Microseconds()) / 1000}
		lo, hi, end := time.Time{}, time.Time{}, time.Time{}
		for _, rec := range b.ended[1 : n-1] {
			if s := *rec.StartedAt; lo.IsZero() || s.Before(lo) {
				lo = s
			}
			if s := *rec.StartedAt; s.After(hi) {
				hi = s
			}
			if f := *rec.FinishedAt; f.After(end) {
				end = f
			}
		}
		r.Phases["middle_first_started"], r.Phases["middle_last_started"], r.Phases["middle_last_ended"] = ms(&lo), ms(&hi), ms(&end)
	}
	if len(gaps) > 0 {
		slices.Sort(gaps)
		at := func(q float64) float64 { return float64(gaps[int(q*float64(len(gaps)-1))].Microseconds()) / 1000 }
		r.ReleaseP50Ms, r.ReleaseP99Ms = at(0.50), at(0.99)
	}
	if r.Missing > 0 {
		return r, fmt.Errorf("%d of %d nodes did not end within %s", r.Missing, len(b.g.ids), timeout)
	}
	return r, nil
}

// result takes a final version: the node ended; the planner submits the
// nodes whose parents have all ended.
func (b *bench) result(m *nats.Msg) {
	i := strings.LastIndexByte(m.Subject, '.')
	if !strings.HasPrefix(m.Subject[i+1:], b.tag) {
		return
	}
	var rec record
	if json.Unmarshal(m.Data, &rec) != nil {
		return
	}
	n := b.node(rec.ID)
	b.mu.Lock()
	defer b.mu.Unlock()
	if n < 0 || b.ended[n] != nil {
		return
	}
	b.ended[n] = &rec
	b.count++
	if b.planner {
		var ready []int
		for _, c := range b.children[n] {
			if b.pending[c]--; b.pending[c] == 0 {
				ready = append(ready, c)
			}
		}
		if err := b.submit(ready); err != nil {
			log.Printf("submit: %v", err)
		}
	}
	if b.count == len(b.g.ids) {
		close(b.done)
	}
}

// submit sends nodes' jobs as requests, each answered on its own inbox;
// b.mu is held.
func (b *bench) submit(nodes []int) error {
	for _, i := range nodes {
		body, _ := json.Marshal(map[string]any{"id": b.jobID(i, false), "pool": b.pool, "command": []string{"true"}})
		b.bodies[i] = body
		if err := b.nc.PublishRequest("fleet.t."+b.tenant+".submit", b.inbox+"."+strconv.Itoa(i), body); err != nil {
			return err
		}
	}
	return nil
}

// answer reads a submission's answer: a busy fleet (503, no body) gets
// the request again, as a producer does; a refusal stops the bench.
func (b *bench) answer(m *nats.Msg) {
	if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
		i, err := strconv.Atoi(m.Subject[len(b.inbox)+1:])
		b.mu.Lock()
		body := b.bodies[i]
		b.mu.Unlock()
		if err == nil && body != nil {
			time.AfterFunc(10*time.Millisecond, func() { _ = b.nc.PublishRequest("fleet.t."+b.tenant+".submit", m.Subject, body) })
		}
		return
	}
	var a struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(m.Data, &a) != nil || a.Error != "" {
		log.Fatalf("a job was refused: %s", m.Data)
	}
}

// submitRun submits the graph as one run.
func (b *bench) submitRun() error {
	type node struct {
		ID    string         `json:"id"`
		After []string       `json:"after,omitempty"`
		Job   map[string]any `json:"job"`
	}
	nodes := make([]node, len(b.g.ids))
	for i, id := range b.g.ids {
		nodes[i] = node{ID: id, Job: map[string]any{"pool": b.pool, "command": []string{"true"}}}
		for _, p := range b.g.parents[i] {
			nodes[i].After = append(nodes[i].After, b.g.ids[p])
		}
	}
	body, err := json.Marshal(map[string]any{"id": b.tag, "nodes": nodes})
	if err != nil {
		return err
	}
	for {
		m, err := b.nc.Request("fleet.t."+b.tenant+".runs.submit", body, time.Minute)
		if err != nil {
			return fmt.Errorf("submit the run: %w", err)
		}
		if m.Header.Get("Status") == "503" {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		var a struct {
			Error    string   `json:"error"`
			Problems []string `json:"problems"`
		}
		if err := json.Unmarshal(m.Data, &a); err != nil || a.Error != "" {
			return fmt.Errorf("the run was refused: %s %v", a.Error, a.Problems)
		}
		return nil
	}
}
