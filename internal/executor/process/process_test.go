package process

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
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

// How attempts end, their env, workspace, outputs and output lines, and
// crash recovery are the conformance suite's (TestConformance); these tests
// cover what is the process executor's own.

func TestAProcessKilledByASignalFails(t *testing.T) {
	e := newExec(t)
	out, _ := run(t, e, context.Background(), &job.Request{Command: []string{"sh", "-c", "kill -9 $$"}})
	if out.Status != job.StatusFailed || out.ExitCode == nil || *out.ExitCode != 137 || out.Failure == nil ||
		out.Failure.Code != job.CodeExitCode || out.Failure.Message != "killed by signal 9 (killed)" {
		t.Errorf("got %s exit %v failure %+v", out.Status, out.ExitCode, out.Failure)
	}
}

// Recover finds a process of an earlier life by its working directory when
// it hid its environment, removes that life's workspaces, kept ones
// included, and leaves another worker's alone.
func TestRecoverFindsWhatAnEarlierLifeLeft(t *testing.T) {
	dir := t.TempDir()
	e, err := New(Config{Dir: dir, KeepFailed: true, Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, e, context.Background(), &job.Request{Command: []string{"false"}}); out.Status != job.StatusFailed {
		t.Fatalf("status %s", out.Status)
	}
	workspaceOf := func(worker string) *workspace.Dir {
		d, err := workspace.Create(dir, "left", 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.Root, ownerFile), []byte(worker), 0o600); err != nil {
			t.Fatal(err)
		}
		return d
	}
	mine, theirs := workspaceOf("w"), workspaceOf("someone-else")
	hidden := exec.Command("env", "-i", "sleep", "60")
	hidden.Dir = mine.Work
	if err := hidden.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- hidden.Wait() }()
	t.Cleanup(func() { _ = hidden.Process.Kill() })

	if err := e.Recover(context.Background(), "w"); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("the process in the earlier life's workspace still runs")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || filepath.Join(dir, entries[0].Name()) != theirs.Root {
		t.Errorf("workspaces left: %v, want only %s", entries, theirs.Root)
	}
}

func TestValidateRefusesWhatAProcessCannotDo(t *testing.T) {
	e := newExec(t)
	for _, r := range []*job.Request{
		{Command: []string{"true"}, Workdir: "/etc"},
		{Command: []string{"true"}, Resources: &job.Resources{GPU: 1}},
	} {
		if err := e.Validate(r); err == nil {
			t.Errorf("accepted %+v", r)
		}
	}
}
