package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// processFleet starts a fleet with a worker that runs real processes, and
// returns its NATS URL.
func processFleet(t *testing.T) string {
	t.Helper()
	f := fleettest.Start(t)
	e, err := process.New(process.Config{Dir: t.TempDir(), Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, e, worker.Config{Slots: 4, RunningAfter: 20 * time.Millisecond})
	return f.NATS.URL()
}

// lacks reports which of want out lacks, each a line's fields in order
// (a row of a table, whatever its spacing).
func lacks(out string, want ...string) []string {
	var rows []string
	for _, line := range strings.Split(out, "\n") {
		rows = append(rows, strings.Join(strings.Fields(line), " "))
	}
	var missing []string
	for _, w := range want {
		found := false
		for _, r := range rows {
			if strings.Contains(r, w) {
				found = true
			}
		}
		if !found {
			missing = append(missing, w)
		}
	}
	return missing
}

// TestRunSubmitWaitShowAndList: a run submitted from a file and from
// standard input, followed to its end, shown, listed; the same run again
// is not run again; another tenant does not see it.
func TestRunSubmitWaitShowAndList(t *testing.T) {
	url := processFleet(t)
	run := file(t, "run.json", `{"id": "r1", "labels": {"team": "data"}, "nodes": [
		{"id": "a", "job": {"command": ["sh", "-c", "printf 42 > $FLEET_OUTPUTS/v"], "outputs": ["v"]}},
		{"id": "b", "after": ["a"], "inputs_from": {"v": {"node": "a", "output": "v"}}, "job": {"command": ["sh", "-c", "cat $FLEET_INPUTS/v"]}},
		{"id": "c", "after": ["a"], "job": {"command": ["true"]}}]}`)

	code, out, errOut := fleetctl(t, "--nats-url", url, "run", "submit", "-f", run, "--wait")
	if code != exitOK {
		t.Fatalf("run submit --wait: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if m := lacks(out, "run r1 submitted: 3 nodes", "run r1 succeeded in round 1", "NODE STATE JOB CODE",
		"a succeeded r1:a -", "b succeeded r1:b -", "c succeeded r1:c -"); m != nil || strings.Contains(out, "to run again") {
		t.Errorf("run submit --wait printed %q; it lacks %q", out, m)
	}

	code, out, errOut = fleetctl(t, "--nats-url", url, "run", "show", "r1")
	if code != exitOK {
		t.Fatalf("run show: exit %d, %s", code, errOut)
	}
	if m := lacks(out, "run: r1", "state: succeeded (round 1)", "labels: team=data", "NODE STATE JOB WAITING FOR / CODE",
		"a succeeded r1:a -", "b succeeded r1:b -", "c succeeded r1:c -", "finished:"); m != nil {
		t.Errorf("run show printed %q; it lacks %q", out, m)
	}
	code, out, _ = fleetctl(t, "run", "show", "r1", "-o", "json", "--nats-url", url)
	var v job.RunView
	if err := json.Unmarshal([]byte(out), &v); code != exitOK || err != nil || v.RunID != "r1" || v.State != job.RunSucceeded ||
		len(v.Nodes) != 3 || v.Nodes[1].After[0] != "a" {
		t.Errorf("run show -o json: exit %d, %v, %+v", code, err, v)
	}

	// Again, it is not run again; with --wait it is followed to the end
	// it had.
	code, out, errOut = fleetctl(t, "--nats-url", url, "run", "submit", "-f", run)
	if code != exitOK || out != "run r1: 3 nodes\n" || !strings.Contains(errOut, "run r1 already exists (succeeded): not submitted again\n") {
		t.Errorf("the same run again: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = fleetctl(t, "--nats-url", url, "run", "submit", "-f", run, "--wait", "-o", "json")
	var end job.RunEnd
	if err := json.Unmarshal([]byte(out), &end); code != exitOK || err != nil || end.State != job.RunSucceeded || len(end.Nodes) != 3 ||
		!strings.Contains(errOut, "not submitted again; following it") {
		t.Errorf("the same run again, --wait -o json: exit %d, stdout %q (%v), stderr %q", code, out, err, errOut)
	}

	// From standard input, with no id: the fleet names it.
	stdin := file(t, "stdin.json", `{"nodes": [{"id": "only", "job": {"command": ["true"]}}]}`)
	in, err := os.Open(stdin)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	was := os.Stdin
	os.Stdin = in
	code, out, errOut = fleetctl(t, "--nats-url", url, "-o", "json", "run", "submit", "-f", "-")
	os.Stdin = was
	var sub job.RunSubmitReply
	if err := json.Unmarshal([]byte(out), &sub); code != exitOK || err != nil || sub.RunID == "" || sub.Nodes != 1 {
		t.Fatalf("run submit -f - -o json: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	code, out, _ = fleetctl(t, "--nats-url", url, "run", "list")
	if code != exitOK || out != "r1\n"+sub.RunID+"\n" {
		t.Errorf("run list: exit %d, %q; want r1 and %s", code, out, sub.RunID)
	}
	code, out, errOut = fleetctl(t, "--nats-url", url, "--tenant", "acme", "run", "list")
	if code != exitOK || out != "" || !strings.Contains(errOut, "tenant acme has no runs") {
		t.Errorf("run list as acme: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = fleetctl(t, "--nats-url", url, "--tenant", "acme", "-o", "json", "run", "list")
	if code != exitOK || strings.Join(strings.Fields(out), "") != `{"runs":[]}` {
		t.Errorf("run list -o json as acme: exit %d, %q", code, out)
	}
	code, _, errOut = fleetctl(t, "--nats-url", url, "--tenant", "acme", "run", "show", "r1")
	if code != exitNotFound || !strings.Contains(errOut, "tenant acme has no run r1: fleetctl run list lists its runs") {
		t.Errorf("another tenant's run: exit %d, stderr %q", code, errOut)
	}
}

// TestRunSubmitRefusedSaysEveryProblem: a refused run exits 2 with every
// problem, each naming its node and field; a job request given as a run
// is told where it goes.
func TestRunSubmitRefusedSaysEveryProblem(t *testing.T) {
	url := processFleet(t)
	bad := file(t, "bad.json", `{"id": "bad", "nodes": [
		{"id": "a", "after": ["nosuch"], "job": {"command": ["true"]}},
		{"id": "b", "when": "sometimes", "job": {"command": ["true"], "priority": 9}},
		{"id": "c", "after": ["a"], "inputs_from": {"in": {"node": "a", "output": "none"}}, "job": {"command": ["true"]}}]}`)
	for _, wait := range [][]string{nil, {"--wait"}} {
		code, out, errOut := fleetctl(t, append([]string{"--nats-url", url, "run", "submit", "-f", bad}, wait...)...)
		if code != exitUsage || out != "" {
			t.Errorf("a bad run %q: exit %d, stdout %q", wait, code, out)
		}
		if m := lacks(errOut, "run refused, 4 problem(s); fix them and submit it again:",
			`nodes[0] (a).after: "nosuch" is not a node of the run`,
			`nodes[1] (b).when: "sometimes" is not a rule`,
			`nodes[1] (b).job.priority`,
			`nodes[2] (c).inputs_from.in.output: "none" is not an output node a declares`); m != nil {
			t.Errorf("a bad run %q: stderr %q lacks %q", wait, errOut, m)
		}
	}
	code, out, _ := fleetctl(t, "--nats-url", url, "-o", "json", "run", "submit", "-f", bad)
	var sub job.RunSubmitReply
	if err := json.Unmarshal([]byte(out), &sub); code != exitUsage || err != nil || len(sub.Problems) != 4 {
		t.Errorf("a bad run, -o json: exit %d, %q", code, out)
	}
	if code, _, errOut := fleetctl(t, "--nats-url", url, "run", "show", "bad"); code != exitNotFound {
		t.Errorf("the refused run is kept: run show exits %d, %s", code, errOut)
	}

	req := file(t, "job.json", `{"command": ["true"]}`)
	code, _, errOut := fleetctl(t, "--nats-url", url, "run", "submit", "-f", req)
	if code != exitUsage || !strings.Contains(errOut, `unknown field "command"`) ||
		!strings.Contains(errOut, req+" holds a job request, not a run: submit it with fleetctl submit -f "+req) {
		t.Errorf("a job request as a run: exit %d, stderr %q", code, errOut)
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run"}, exitUsage, "run needs submit, show, watch, list, cancel or retry"},
		{[]string{"run", "frob", "r1"}, exitUsage, `not "frob"`},
		{[]string{"run", "submit"}, exitUsage, "run submit needs -f FILE"},
		{[]string{"run", "submit", "-f", filepath.Join(t.TempDir(), "none.json")}, exitUsage, "read the run:"},
		{[]string{"run", "show"}, exitUsage, "run show needs one run id"},
		{[]string{"run", "show", "r1", "--wait"}, exitUsage, "-f and --wait are run submit's; to follow a run, use fleetctl run watch RUN"},
		{[]string{"run", "show", "r1:a"}, exitUsage, "r1:a is the job of a node of run r1: fleetctl status r1:a shows the job, fleetctl run show r1 the run"},
		{[]string{"run", "retry", "not a run"}, exitUsage, `"not a run" is not a run id`},
		{[]string{"run", "show", "nosuch"}, exitNotFound, "tenant default has no run nosuch"},
		{[]string{"run", "cancel", "nosuch"}, exitNotFound, "tenant default has no run nosuch"},
		{[]string{"run", "retry", "nosuch"}, exitNotFound, "tenant default has no run nosuch"},
		{[]string{"run", "watch", "nosuch"}, exitNotFound, "tenant default has no run nosuch"},
	} {
		code, _, errOut := fleetctl(t, append([]string{"--nats-url", url}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
}

// TestRunFailsIsRetriedAndCancelled: a run that fails exits 1 and says how
// to retry it; a retry runs what failed again; a run that runs is not
// retried (the error says to cancel it or wait), and is cancelled.
func TestRunFailsIsRetriedAndCancelled(t *testing.T) {
	url := processFleet(t)
	flag := filepath.Join(t.TempDir(), "ok")
	run := file(t, "run.json", `{"id": "r2", "nodes": [
		{"id": "a", "job": {"command": ["true"]}},
		{"id": "b", "after": ["a"], "job": {"command": ["test", "-e", "`+flag+`"], "retry": {"max_attempts": 1}}},
		{"id": "c", "after": ["b"], "job": {"command": ["true"]}}]}`)
	code, out, errOut := fleetctl(t, "--nats-url", url, "--tenant", "acme", "run", "submit", "-f", run, "--wait")
	if code != exitJobFail {
		t.Fatalf("run submit --wait of a run that fails: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if m := lacks(out, "run r2 failed in round 1", "a succeeded r2:a -", "b failed r2:b exit_code", "c cancelled r2:c upstream_failed",
		"to run again what did not succeed: fleetctl --tenant acme run retry r2"); m != nil {
		t.Errorf("run submit --wait printed %q; it lacks %q", out, m)
	}
	code, out, _ = fleetctl(t, "--nats-url", url, "--tenant", "acme", "run", "show", "r2")
	if m := lacks(out, "state: failed (round 1)", "b failed r2:b exit_code", "c cancelled r2:c upstream_failed",
		"to run again what did not succeed: fleetctl --tenant acme run retry r2"); code != exitOK || m != nil {
		t.Errorf("run show of a failed run: exit %d, %q; it lacks %q", code, out, m)
	}

	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = fleetctl(t, "--nats-url", url, "--tenant", "acme", "run", "retry", "r2")
	if code != exitOK || !strings.Contains(out, "run r2: round 2 runs 2 node(s) again: b, c\nto follow it: fleetctl --tenant acme run watch r2\n") {
		t.Fatalf("run retry: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = fleetctl(t, "--nats-url", url, "--tenant", "acme", "run", "watch", "r2")
	if m := lacks(out, "run r2 succeeded in round 2", "a succeeded r2:a -", "b succeeded r2:b:2 -", "c succeeded r2:c:2 -"); code != exitOK || m != nil {
		t.Errorf("run watch of round 2: exit %d, stdout %q, stderr %q; it lacks %q", code, out, errOut, m)
	}
	code, out, _ = fleetctl(t, "--nats-url", url, "--tenant", "acme", "run", "retry", "r2")
	if code != exitOK || out != "run r2: nothing to retry: the run succeeded\n" {
		t.Errorf("run retry of a run that succeeded: exit %d, %q", code, out)
	}

	slow := file(t, "slow.json", `{"id": "slow", "nodes": [
		{"id": "sleep", "job": {"command": ["sleep", "60"]}},
		{"id": "after", "after": ["sleep"], "job": {"command": ["true"]}}]}`)
	if code, _, errOut := fleetctl(t, "--nats-url", url, "run", "submit", "-f", slow); code != exitOK {
		t.Fatalf("run submit: exit %d, %s", code, errOut)
	}
	code, out, errOut = fleetctl(t, "--nats-url", url, "run", "retry", "slow")
	if code != exitUsage || out != "" || !strings.Contains(errOut,
		"run slow has not ended: round 1 is running; cancel it first (fleetctl run cancel slow) or wait for its end (fleetctl run watch slow), then retry it") {
		t.Errorf("run retry of a run that runs: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = fleetctl(t, "--nats-url", url, "run", "cancel", "slow")
	if code != exitOK || out != "run slow: every node that has not ended is cancelled (round 1)\n" {
		t.Errorf("run cancel: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// The node after it ends cancelled by the run's cancel, or, should
	// the end of the node it comes after be taken first, as
	// upstream_failed: either is its code.
	code, out, _ = fleetctl(t, "--nats-url", url, "run", "watch", "slow")
	if m := lacks(out, "run slow cancelled in round 1", "sleep cancelled slow:sleep cancelled", "after cancelled slow:after"); code != exitJobFail || m != nil {
		t.Errorf("run watch of a cancelled run: exit %d, %q; it lacks %q", code, out, m)
	}
	code, out, _ = fleetctl(t, "--nats-url", url, "run", "cancel", "slow")
	if code != exitOK || !strings.Contains(out, "run slow: nothing to cancel: the run has ended (cancelled)") ||
		!strings.Contains(out, "to run again what did not succeed: fleetctl run retry slow\n") {
		t.Errorf("run cancel of an ended run: exit %d, %q", code, out)
	}
}

// syncBuffer is a buffer one goroutine writes while another reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunWatchPrintsNodeEventsAsTheyCome: run watch prints how the run
// stands, then each node's job queued, started and ended as it happens,
// then the run's end; -o json, one document a line.
func TestRunWatchPrintsNodeEventsAsTheyCome(t *testing.T) {
	url := processFleet(t)
	gate := filepath.Join(t.TempDir(), "open")
	doc := file(t, "run.json", `{"id": "gated", "nodes": [
		{"id": "gate", "job": {"command": ["sh", "-c", "while [ ! -e `+gate+` ]; do sleep 0.05; done"]}},
		{"id": "next", "after": ["gate"], "job": {"command": ["true"]}}]}`)
	if code, _, errOut := fleetctl(t, "--nats-url", url, "run", "submit", "-f", doc); code != exitOK {
		t.Fatalf("run submit: exit %d, %s", code, errOut)
	}
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- run([]string{"--nats-url", url, "run", "watch", "gated"}, &stdout, &stderr) }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stdout.String(), "run gated is running (round 1): 0 of 2 nodes ended") {
		if time.Now().After(deadline) {
			t.Fatalf("run watch did not say how the run stands: stdout %q, stderr %q", stdout.String(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The watch says how the run stands once it hears what comes next
	// (it replays nothing): the gate opens now.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var code int
	select {
	case code = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("run watch did not end: stdout %q", stdout.String())
	}
	out := stdout.String()
	if m := lacks(out, "gate succeeded", "next queued pool default", "next started attempt 1 on", "next succeeded attempt 1, exit 0",
		"run gated succeeded in round 1"); code != exitOK || m != nil {
		t.Errorf("run watch: exit %d, stdout %q, stderr %q; it lacks %q", code, out, stderr.String(), m)
	}
	// The events come in order: next's after gate's end.
	gateEnded, nextQueued := -1, -1
	for i, line := range strings.Split(out, "\n") {
		switch f := strings.Fields(line); {
		case len(f) >= 3 && f[1] == "gate" && f[2] == "succeeded":
			gateEnded = i
		case len(f) >= 3 && f[1] == "next" && f[2] == "queued":
			nextQueued = i
		}
	}
	if gateEnded < 0 || nextQueued < gateEnded {
		t.Errorf("next was queued before gate ended:\n%s", out)
	}

	code, out, _ = fleetctl(t, "--nats-url", url, "-o", "json", "run", "watch", "gated")
	sc := bufio.NewScanner(strings.NewReader(out))
	var lines []runLine
	for sc.Scan() {
		var l runLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("run watch -o json: %q is not a line of it: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if code != exitOK || len(lines) != 1 || lines[0].End == nil || lines[0].End.State != job.RunSucceeded {
		t.Errorf("run watch -o json of an ended run: exit %d, %q; want one line, its end", code, out)
	}
}

// TestEventTextOfANodeThatNeverRan: a node ended by its rule, before any
// attempt, reads as its failure alone.
func TestEventTextOfANodeThatNeverRan(t *testing.T) {
	three := 3
	for _, c := range []struct {
		ev   *job.Event
		want string
	}{
		{&job.Event{Type: job.EventCancelled, Failure: &job.Failure{Class: "cancelled", Code: job.CodeUpstreamFailed}, Message: "node b did not succeed"},
			"cancelled cancelled/upstream_failed: node b did not succeed"},
		{&job.Event{Type: job.EventFailed, Attempt: 2, ExitCode: &three, Failure: &job.Failure{Class: "execution", Code: "exit_code"}},
			"failed attempt 2, exit 3, execution/exit_code"},
		{&job.Event{Type: job.EventSucceeded, Attempt: 1}, "succeeded attempt 1"},
	} {
		if got := strings.Join(strings.Fields(eventText(c.ev)), " "); got != c.want {
			t.Errorf("%+v: %q, want %q", c.ev, got, c.want)
		}
	}
}
