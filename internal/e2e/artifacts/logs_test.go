package artifacts_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// checkLines checks that out holds "line 1" to "line n", one per line, in
// order, and nothing else.
func checkLines(t *testing.T, what string, r io.Reader, n int) {
	t.Helper()
	sc := bufio.NewScanner(r)
	i := 0
	for sc.Scan() {
		i++
		if want := fmt.Sprintf("line %d", i); sc.Text() != want {
			t.Fatalf("%s: line %d is %q, want %q", what, i, sc.Text(), want)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if i != n {
		t.Fatalf("%s: %d lines, want %d", what, i, n)
	}
}

// TestWholeLogs: a job printing 1,000,000 lines has all of them, in
// order, in fleetctl logs and in GET /v1/jobs/{id}/logs (with its length
// and digest, the attempt having ended); a job killed by its timeout
// keeps what it printed before; a log over --max-log-bytes is truncated
// and the result says so.
func TestWholeLogs(t *testing.T) {
	f := fleettest.Start(t)
	prog := executortest.TestProgram(t)
	e, err := process.New(process.Config{Dir: t.TempDir(), Grace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, e, worker.Config{Slots: 2, Artifacts: f.Artifacts(t)})

	t.Run("a million lines", func(t *testing.T) {
		const n = 1_000_000
		fleettest.Binary(t, "fleetctl") // built before it is timed
		start := time.Now()
		id := f.Submit(t, &job.Request{Command: []string{prog, "lines", fmt.Sprint(n)}, Timeout: durationOf(3 * time.Minute)})
		r := f.Await(t, id, 3*time.Minute)
		if r.Status != job.StatusSucceeded || r.Log != nil {
			t.Fatalf("status %s, log %+v: %+v", r.Status, r.Log, r.Failure)
		}
		t.Logf("the job and its log: %s", time.Since(start).Round(time.Millisecond))
		start = time.Now()
		checkLines(t, "fleetctl logs", strings.NewReader(fleetctl(t, f, "logs", id)), n)
		t.Logf("fleetctl logs: %s", time.Since(start).Round(time.Millisecond))
		start = time.Now()
		fleetctl(t, f, "logs", id, "--timestamps")
		t.Logf("fleetctl logs --timestamps: %s", time.Since(start).Round(time.Millisecond))

		resp, sum, size := httpGet(t, f, "/v1/jobs/"+id+"/logs")
		if resp.StatusCode != 200 || resp.ContentLength != size || resp.Header.Get("ETag") != `"`+sum+`"` || resp.Header.Get("X-Fleet-Attempt") != "1" {
			t.Errorf("GET logs: %s, %d bytes of %d, ETag %s (SHA-256 %s)", resp.Status, size, resp.ContentLength, resp.Header.Get("ETag"), sum)
		}
		// The lines as the Go client gives them, time and stream included.
		ctx := context.Background()
		lr, err := f.Client.Logs(ctx, id, client.LogOptions{Attempt: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer lr.Close()
		sc := bufio.NewScanner(lr)
		sc.Scan()
		first, err := client.ParseLogLine(sc.Text())
		if err != nil || first.Stream != "stdout" || first.Line != "line 1" || first.Time.Before(*r.StartedAt) || first.Time.After(r.FinishedAt) {
			t.Errorf("first line %+v, %v (the attempt ran from %s to %s)", first, err, r.StartedAt, r.FinishedAt)
		}
	})

	t.Run("killed by its timeout", func(t *testing.T) {
		id := f.Submit(t, &job.Request{Command: []string{prog, "lines", "5000", "stderr", "about to hang", "sleep", "1m"},
			Timeout: durationOf(2 * time.Second)})
		r := f.Await(t, id, time.Minute)
		if r.Status != job.StatusTimedOut {
			t.Fatalf("status %s: %+v", r.Status, r.Failure)
		}
		// The job's two streams reach the worker through two pipes: each
		// stream's lines keep their order, and the stderr line is there.
		var stdout []string
		hung := 0
		for _, l := range strings.Split(strings.TrimSuffix(fleetctl(t, f, "logs", id, "--timestamps"), "\n"), "\n") {
			switch _, rest, _ := strings.Cut(l, " "); {
			case strings.HasPrefix(rest, "stdout "):
				stdout = append(stdout, strings.TrimPrefix(rest, "stdout "))
			case rest == "stderr about to hang":
				hung++
			default:
				t.Fatalf("unexpected line %q", l)
			}
		}
		checkLines(t, "stdout before the timeout", strings.NewReader(strings.Join(stdout, "\n")), 5000)
		if hung != 1 {
			t.Errorf("the stderr line came %d times", hung)
		}
	})

	t.Run("truncated at the limit", func(t *testing.T) {
		small := fleettest.Start(t)
		e, err := process.New(process.Config{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		small.Worker(t, e, worker.Config{Artifacts: small.Artifacts(t), ArtifactLimits: artifact.Limits{MaxLogBytes: 64 << 10}})
		id := small.Submit(t, &job.Request{Command: []string{prog, "lines", "10000"}})
		r := small.Await(t, id, time.Minute)
		if r.Status != job.StatusSucceeded || r.Log == nil || !r.Log.Truncated || r.Log.Limit != 64<<10 ||
			r.Log.Lines+r.Log.DroppedLines != 10000 || r.Log.Bytes > 64<<10 {
			t.Fatalf("status %s, log %+v", r.Status, r.Log)
		}
		out := strings.Split(strings.TrimSpace(fleetctl(t, small, "logs", id, "-o", "json")), "\n")
		var last client.LogLine
		if err := json.Unmarshal([]byte(out[len(out)-1]), &last); err != nil {
			t.Fatal(err)
		}
		if int64(len(out)) != r.Log.Lines+1 || last.Stream != "fleet" || !strings.Contains(last.Line, "--max-log-bytes") {
			t.Errorf("%d lines (the result says %d kept), the last %+v", len(out), r.Log.Lines, last)
		}
	})
}

// TestFollowStreamsARunningJob: fleetctl logs --follow prints a running
// job's lines while it runs, goes on to its next attempt when the first
// fails, and exits once the job has ended.
func TestFollowStreamsARunningJob(t *testing.T) {
	f := fleettest.Start(t)
	e, err := process.New(process.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, e, worker.Config{Artifacts: f.Artifacts(t)})
	backoff := job.Duration(300 * time.Millisecond)
	id := f.Submit(t, &job.Request{
		Command: []string{"sh", "-c", `if [ "$FLEET_ATTEMPT" = 1 ]; then
			for i in $(seq 1 20); do echo line $i; sleep 0.1; done; exit 3
		fi
		for i in $(seq 21 30); do echo line $i; sleep 0.1; done`},
		Retry: &job.RetryPolicy{MaxAttempts: 2, InitialBackoff: &backoff}})

	cmd := exec.Command(fleettest.Binary(t, "fleetctl"), "logs", id, "--follow")
	cmd.Env = append(os.Environ(), "FLEET_NATS_URL="+f.NATS.URL())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	sc := bufio.NewScanner(stdout)
	var heard []time.Time
	i := 0
	for sc.Scan() {
		i++
		if want := fmt.Sprintf("line %d", i); sc.Text() != want {
			t.Fatalf("line %d is %q, want %q", i, sc.Text(), want)
		}
		heard = append(heard, time.Now())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("fleetctl logs --follow: %v\n%s", err, stderr.String())
	}
	if i != 30 {
		t.Fatalf("followed %d lines, want 30", i)
	}
	r := f.Await(t, id, 10*time.Second)
	if r.Status != job.StatusSucceeded || r.Attempts != 2 {
		t.Fatalf("result %s after %d attempts", r.Status, r.Attempts)
	}
	// The first line came while the first attempt still ran (it ran for
	// two seconds after it), not with the log's end.
	if end := r.History[0].FinishedAt; !heard[0].Before(end.Add(-time.Second)) {
		t.Errorf("the first line came at %s, the first attempt ended at %s: not followed live", heard[0], end)
	}
}
