package process

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

type reporter struct {
	mu    sync.Mutex
	lines []string
}

func (r *reporter) Log(stream, line string) {
	r.mu.Lock()
	r.lines = append(r.lines, stream+":"+line)
	r.mu.Unlock()
}
func (r *reporter) Phase(string, string) {}

func run(t *testing.T, e *Executor, ctx context.Context, r *job.Request) (*executor.Outcome, *reporter) {
	t.Helper()
	r.ID = "p1"
	r.Normalize()
	if err := e.Validate(r); err != nil {
		t.Fatal(err)
	}
	rep := &reporter{}
	out, err := e.Run(ctx, &executor.Task{JobID: r.ID, Attempt: 1, WorkerID: "w", Pool: "default", Request: r, Report: rep})
	if err != nil {
		t.Fatal(err)
	}
	return out, rep
}

func newExec(t *testing.T) *Executor {
	e, err := New(Config{Dir: t.TempDir(), Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRunGivesTheJobItsWorkspaceAndOnlyItsEnvironment(t *testing.T) {
	t.Setenv("WORKER_SECRET", "do-not-leak")
	e := newExec(t)
	out, rep := run(t, e, context.Background(), &job.Request{
		Command: []string{"sh", "-c", `echo "$GREETING $(cat $FLEET_INPUTS/in.txt) secret=${WORKER_SECRET:-none} attempt=$FLEET_ATTEMPT"; pwd > $FLEET_OUTPUTS/pwd; echo err >&2`},
		Env:     map[string]string{"GREETING": "hello"}, Inputs: map[string]string{"in.txt": "world"},
		Outputs: []string{"pwd"}, Workdir: "sub/dir"})
	if out.Status != job.StatusSucceeded {
		t.Fatalf("%+v", out)
	}
	if out.Stdout != "hello world secret=none attempt=1\n" || out.Stderr != "err\n" {
		t.Errorf("stdout %q stderr %q", out.Stdout, out.Stderr)
	}
	if !strings.HasSuffix(strings.TrimSpace(out.Outputs["pwd"]), "/work/sub/dir") {
		t.Errorf("workdir %q", out.Outputs["pwd"])
	}
	if len(rep.lines) != 2 {
		t.Errorf("log lines %q", rep.lines)
	}
	entries, _ := os.ReadDir(e.cfg.Dir)
	if len(entries) != 0 {
		t.Errorf("workspace left behind: %v", entries)
	}
}

func TestRunReportsHowTheProcessEnded(t *testing.T) {
	e := newExec(t)
	short := job.Duration(300 * time.Millisecond)
	for _, tc := range []struct {
		name   string
		req    *job.Request
		status job.Status
		code   int
		fcode  string
		msg    string
	}{
		{"exit code", &job.Request{Command: []string{"sh", "-c", "exit 7"}}, job.StatusFailed, 7, job.CodeExitCode, "exited with code 7"},
		{"killed by a signal", &job.Request{Command: []string{"sh", "-c", "kill -9 $$"}}, job.StatusFailed, 137, job.CodeExitCode, "killed by signal 9 (killed)"},
		{"timeout, SIGTERM enough", &job.Request{Command: []string{"sleep", "10"}, Timeout: &short}, job.StatusTimedOut, 143, job.CodeAttemptTimeout, "stopped with SIGTERM"},
		{"timeout, SIGKILL needed", &job.Request{Command: []string{"sh", "-c", "trap '' TERM; sleep 10"}, Timeout: &short}, job.StatusTimedOut, 137, job.CodeAttemptTimeout, "SIGKILL after"},
		{"missing output", &job.Request{Command: []string{"true"}, Outputs: []string{"never"}}, job.StatusFailed, 0, job.CodeOutputMissing, "never"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := run(t, e, context.Background(), tc.req)
			if out.Status != tc.status || out.ExitCode == nil || *out.ExitCode != tc.code ||
				out.Failure == nil || out.Failure.Code != tc.fcode || !strings.Contains(out.Failure.Message, tc.msg) {
				t.Errorf("got %s exit %v failure %+v", out.Status, *out.ExitCode, out.Failure)
			}
		})
	}
}

func TestCancelStopsTheProcess(t *testing.T) {
	e := newExec(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { time.Sleep(200 * time.Millisecond); cancel(executor.ErrCancelled) }()
	start := time.Now()
	out, _ := run(t, e, ctx, &job.Request{Command: []string{"sleep", "10"}})
	if out.Status != job.StatusCancelled || out.Failure.Class != job.ClassCancelled || time.Since(start) > 5*time.Second {
		t.Errorf("%+v after %s", out, time.Since(start))
	}
}

func TestValidateRefusesWhatAProcessCannotDo(t *testing.T) {
	e := newExec(t)
	for _, r := range []*job.Request{
		{}, // no command
		{Command: []string{"true"}, Workdir: "/etc"},
		{Command: []string{"true"}, Resources: &job.Resources{GPU: 1}},
	} {
		if err := e.Validate(r); err == nil {
			t.Errorf("accepted %+v", r)
		}
	}
}
