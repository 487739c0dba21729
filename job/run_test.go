package job_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

func node(id string, after ...string) job.RunNode {
	return job.RunNode{ID: id, After: after, Job: &job.Request{Command: []string{"true"}}}
}

// problems validates r and returns its problems, failing t unless r is a
// RunError when it is refused.
func problems(t *testing.T, r *job.RunRequest) []string {
	t.Helper()
	err := r.Validate(job.Limits{}, job.RunLimits{})
	if err == nil {
		return nil
	}
	var re *job.RunError
	if !errors.As(err, &re) {
		t.Fatalf("%T %v; want a *job.RunError", err, err)
	}
	return re.Problems
}

func TestAValidRunPasses(t *testing.T) {
	// A diamond: a, then b and c, then d, which takes b's output.
	d := node("d", "b", "c")
	d.InputsFrom = map[string]job.OutputOf{"in.txt": {Node: "b", Output: "out.txt"}}
	b := node("b", "a")
	b.Job.Outputs = []string{"out.txt"}
	r := &job.RunRequest{ID: "diamond", Nodes: []job.RunNode{node("a"), b, node("c", "a"), d}}
	if p := problems(t, r); p != nil {
		t.Fatalf("refused: %v", p)
	}
	order := r.Order()
	pos := map[string]int{}
	for i, n := range order {
		pos[r.Nodes[n].ID] = i
	}
	for _, n := range r.Nodes {
		for _, p := range n.After {
			if pos[p] >= pos[n.ID] {
				t.Errorf("order %v puts %s before %s, which it comes after", order, n.ID, p)
			}
		}
	}
}

// Every way a run can be wrong is refused, the problem naming the node and
// the field; a run's problems are all listed at once.
func TestBadRunsAreRefusedNamingTheNode(t *testing.T) {
	withOutput := func(n job.RunNode, out string) job.RunNode { n.Job.Outputs = []string{out}; return n }
	withInput := func(n job.RunNode, name, from, out string) job.RunNode {
		n.InputsFrom = map[string]job.OutputOf{name: {Node: from, Output: out}}
		return n
	}
	for _, c := range []struct {
		name  string
		run   *job.RunRequest
		wants []string
	}{
		{"no nodes", &job.RunRequest{ID: "r"}, []string{"nodes: a run needs at least one node"}},
		{"a bad run id", &job.RunRequest{ID: "a.b", Nodes: []job.RunNode{node("a")}}, []string{`id: "a.b"`}},
		{"a cycle", &job.RunRequest{Nodes: []job.RunNode{node("a", "c"), node("b", "a"), node("c", "b"), node("d")}},
			[]string{"(a).after: a cycle: a after c after b after a"}},
		{"a node after itself", &job.RunRequest{Nodes: []job.RunNode{node("a", "a")}}, []string{"nodes[0] (a).after: the node comes after itself"}},
		{"an unknown node", &job.RunRequest{Nodes: []job.RunNode{node("a"), node("b", "x")}},
			[]string{`nodes[1] (b).after: "x" is not a node of the run`}},
		{"two nodes of one id", &job.RunRequest{Nodes: []job.RunNode{node("a"), node("a")}},
			[]string{"nodes[1] (a).id: also the id of nodes[0]"}},
		{"a bad node id", &job.RunRequest{Nodes: []job.RunNode{node("a:b")}}, []string{`nodes[0].id: "a:b"`}},
		{"an output the parent does not declare", &job.RunRequest{Nodes: []job.RunNode{withOutput(node("a"), "x.txt"),
			withInput(node("b", "a"), "in", "a", "y.txt")}},
			[]string{`nodes[1] (b).inputs_from.in.output: "y.txt" is not an output node a declares`}},
		{"an input from a node it does not come after", &job.RunRequest{Nodes: []job.RunNode{withOutput(node("a"), "x.txt"),
			withInput(node("b"), "in", "a", "x.txt")}},
			[]string{`nodes[1] (b).inputs_from.in.node: "a" is not a node this one comes after`}},
		{"a bad rule", &job.RunRequest{Nodes: []job.RunNode{{ID: "a", When: "sometimes", Job: &job.Request{}}}},
			[]string{`nodes[0] (a).when: "sometimes" is not a rule`}},
		{"any_failed with nothing before", &job.RunRequest{Nodes: []job.RunNode{{ID: "a", When: job.WhenAnyFailed, Job: &job.Request{}}}},
			[]string{"nodes[0] (a).when: any_failed needs nodes to come after"}},
		{"no job", &job.RunRequest{Nodes: []job.RunNode{{ID: "a"}}}, []string{"nodes[0] (a).job: is required"}},
		{"a node's job with an id", &job.RunRequest{ID: "r", Nodes: []job.RunNode{{ID: "a", Job: &job.Request{ID: "x"}}}},
			[]string{"nodes[0] (a).job.id: is the fleet's to set: the node's job is r:a"}},
		{"a node's bad request", &job.RunRequest{Nodes: []job.RunNode{{ID: "a", Job: &job.Request{Priority: 9}}}},
			[]string{"nodes[0] (a).job.priority: 9 must be from 1 (highest) to 5 (lowest)"}},
		{"more labels with the run's than a job may have", &job.RunRequest{Labels: labels(32, "run"),
			Nodes: []job.RunNode{{ID: "a", Job: &job.Request{Labels: labels(1, "node")}}}},
			[]string{"nodes[0] (a).job.labels: 33 labels with the run's, over the limit of 32"}},
		{"several at once", &job.RunRequest{Nodes: []job.RunNode{node("a", "x"), {ID: "b", When: "no", Job: &job.Request{}}}},
			[]string{`nodes[0] (a).after: "x"`, `nodes[1] (b).when: "no"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := problems(t, c.run)
			if got == nil {
				t.Fatal("accepted")
			}
			all := strings.Join(got, "\n")
			for _, want := range c.wants {
				if !strings.Contains(all, want) {
					t.Errorf("problems:\n%s\nwant one with %q", all, want)
				}
			}
		})
	}
}

// labels returns n labels, keys prefix-0 on.
func labels(n int, prefix string) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[prefix+"-"+itoa(i)] = "v"
	}
	return m
}

// A node's job carries the run's labels and its own, the node's winning:
// together they are within a job's limit when the keys they share count
// once.
func TestARunsLabelsAndANodesShareTheLimit(t *testing.T) {
	node := labels(2, "run")
	node["own"] = "v"
	r := &job.RunRequest{Labels: labels(31, "run"), Nodes: []job.RunNode{{ID: "a", Job: &job.Request{Labels: node}}}}
	if p := problems(t, r); p != nil {
		t.Errorf("32 labels in all refused: %v", p)
	}
	node["another"] = "v"
	if p := problems(t, r); len(p) != 1 || !strings.Contains(p[0], "33 labels with the run's") {
		t.Errorf("33 labels in all: %v", p)
	}
}

func TestAFanOutOfTheMostNodesPasses(t *testing.T) {
	nodes := []job.RunNode{node("root")}
	var mids []string
	for i := range job.DefaultMaxRunNodes - 2 {
		id := "m" + itoa(i)
		nodes = append(nodes, node(id, "root"))
		mids = append(mids, id)
	}
	nodes = append(nodes, node("sink", mids...))
	r := &job.RunRequest{ID: "fan", Nodes: nodes}
	if p := problems(t, r); p != nil {
		t.Fatalf("refused: %v", p[:min(3, len(p))])
	}
	r.Nodes = append(r.Nodes, node("one-more"))
	if p := problems(t, r); len(p) != 1 || !strings.Contains(p[0], "over the limit of 10000") {
		t.Errorf("a node over the limit: %v", p)
	}
}

func itoa(i int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}

// A run's job ids: the run's, a colon, the node's, and the round from the
// second on; a producer's own ids have no colon.
func TestRunJobIDs(t *testing.T) {
	for _, c := range []struct {
		run, node string
		round     int
		id        string
	}{{"r", "n", 1, "r:n"}, {"nightly-7", "train_2", 2, "nightly-7:train_2:2"}} {
		id := job.RunJobID(c.run, c.node, c.round)
		run, node, round, ok := job.ParseRunJobID(id)
		if id != c.id || !ok || run != c.run || node != c.node || round != c.round || !job.ValidID(id) {
			t.Errorf("%s %s %d: %q -> %q %q %d %v", c.run, c.node, c.round, id, run, node, round, ok)
		}
		if job.ValidSubmittedID(id) {
			t.Errorf("%q is an id a producer may submit", id)
		}
	}
	for _, bad := range []string{"r:", ":n", "r:n:1", "r:n:02", "r:n:x", "r:n:2:3", "a.b:n"} {
		if _, _, _, ok := job.ParseRunJobID(bad); ok || job.ValidID(bad) {
			t.Errorf("%q taken for a run's job id", bad)
		}
	}
	// A request that claims a run's job id must say its run and node.
	r := &job.Request{ID: "r:n", Command: []string{"true"}}
	if err := r.Validate(job.Limits{}); err == nil {
		t.Error("a run's job id without its run_id and node_id accepted")
	}
	r.RunID, r.NodeID = "r", "n"
	if err := r.Validate(job.Limits{}); err != nil {
		t.Errorf("a run's node's request refused: %v", err)
	}
}

func TestDecodeRunRequestIsStrict(t *testing.T) {
	_, err := job.DecodeRunRequest([]byte(`{"id": "r", "nodes": [{"id": "a", "job": {"command": ["true"], "comand": 1}}]}`), job.RunLimits{})
	if err == nil || !strings.Contains(err.Error(), `nodes[0] (a).job: json: unknown field "comand"`) {
		t.Errorf("unknown field in a node's job: %v", err)
	}
	// A job names no tenant: the run's, its subject's or token's, is every
	// node's. A node that says another is refused, named.
	_, err = job.DecodeRunRequest([]byte(`{"nodes": [{"id": "a", "job": {}}, {"id": "b", "job": {"tenant": "acme"}}]}`), job.RunLimits{})
	if err == nil || !strings.Contains(err.Error(), `nodes[1] (b).job: json: unknown field "tenant"`) || strings.Contains(err.Error(), "nodes[0]") {
		t.Errorf("a node of another tenant: %v", err)
	}
	_, err = job.DecodeRunRequest([]byte(`{"nodes": [{"id": "a", "after": "b", "job": {}}]}`), job.RunLimits{})
	if err == nil || !strings.Contains(err.Error(), "nodes[0] (a): ") || !strings.Contains(err.Error(), "after") {
		t.Errorf("a node's field of the wrong type: %v", err)
	}
	_, err = job.DecodeRunRequest([]byte(`{"id": "r", "nodes": []}`+strings.Repeat(" ", 100)), job.RunLimits{MaxBytes: 50})
	if err == nil || !strings.Contains(err.Error(), "over the limit of 50") {
		t.Errorf("a run over MaxBytes: %v", err)
	}
}

// fan10k is a run of 10,000 nodes: one, then 9,998 after it, then one
// after them all, as make bench submits.
func fan10k() []byte {
	var b strings.Builder
	b.WriteString(`{"id": "fan", "nodes": [{"id": "n0", "job": {"command": ["true"]}}`)
	for i := 1; i < 9999; i++ {
		fmt.Fprintf(&b, `, {"id": "n%d", "after": ["n0"], "job": {"command": ["true"]}}`, i)
	}
	b.WriteString(`, {"id": "n9999", "after": [`)
	for i := 1; i < 9999; i++ {
		if i > 1 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `"n%d"`, i)
	}
	b.WriteString(`], "job": {"command": ["true"]}}]}`)
	return []byte(b.String())
}

// BenchmarkDecodeAndValidateARunOf10000Nodes: what a dispatcher does with
// the largest run before it admits its nodes.
func BenchmarkDecodeAndValidateARunOf10000Nodes(b *testing.B) {
	data := fan10k()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		r, err := job.DecodeRunRequest(data, job.RunLimits{})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Validate(job.Limits{}, job.RunLimits{}); err != nil {
			b.Fatal(err)
		}
	}
}
