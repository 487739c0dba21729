package executortest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// readyLine is what a long program prints once it runs.
const readyLine = "ready"

// lineWait bounds the wait for a program's ready line: a container or a
// pod may take a while to start on a busy machine.
const lineWait = 90 * time.Second

func testSuccess(t *testing.T, s *suite) {
	inst, c := s.start(t, Program{
		Echo("hello"),
		Copy("$FLEET_INPUTS/in.txt", outputsDir("copied.txt")),
		Write(outputsDir("greeting.txt"), "hi"),
	})
	a := s.newAttempt(inst, c, func(r *job.Request) {
		if s.has(Programs) {
			r.Inputs = map[string]string{"in.txt": "from the inputs"}
			r.Outputs = []string{"copied.txt", "greeting.txt"}
		}
	})
	before := time.Now()
	out := s.mustRun(t, context.Background(), a)
	after := time.Now()
	if out.Status != job.StatusSucceeded || out.Failure != nil {
		t.Fatalf("got %s, want succeeded", describe(out))
	}
	if out.ExitCode == nil || *out.ExitCode != 0 {
		t.Errorf("exit code %v, want 0", out.ExitCode)
	}
	// A second of slack for a backend whose clock is not ours.
	if out.StartedAt.Before(before.Add(-time.Second)) || out.FinishedAt.After(after.Add(time.Second)) || out.FinishedAt.Before(out.StartedAt) {
		t.Errorf("started %s, finished %s; Run ran from %s to %s", out.StartedAt, out.FinishedAt, before, after)
	}
	if s.has(Programs) {
		want := map[string]string{"copied.txt": "from the inputs", "greeting.txt": "hi"}
		if !maps.Equal(out.Outputs, want) {
			t.Errorf("outputs %q, want %q", out.Outputs, want)
		}
	} else if len(out.Outputs) != 0 {
		t.Errorf("outputs %q, none declared", out.Outputs)
	}
	nothingLeft(t, inst, 0)
}

func testMissingOutput(t *testing.T, s *suite) {
	inst, c := s.start(t, Program{Write(outputsDir("written.txt"), "x")})
	a := s.newAttempt(inst, c, func(r *job.Request) { r.Outputs = []string{"written.txt", "never.txt"} })
	out := s.mustRun(t, context.Background(), a)
	s.wantFailure(t, out, job.StatusFailed, job.ClassExecution, job.CodeOutputMissing)
	if !strings.Contains(out.Failure.Message, "never.txt") {
		t.Errorf("message %q does not name the missing output", out.Failure.Message)
	}
	nothingLeft(t, inst, 0)
}

func testExitCode(t *testing.T, s *suite) {
	// What the job started and left running must not outlive it.
	inst, c := s.start(t, Program{Spawn(time.Minute), Stderr("about to fail"), Exit(3)})
	begin := time.Now()
	out := s.mustRun(t, context.Background(), s.newAttempt(inst, c, nil))
	if took := time.Since(begin); took > Slack {
		t.Errorf("Run took %s: it waited for what the job left running instead of stopping it", took)
	}
	s.wantFailure(t, out, job.StatusFailed, job.ClassExecution, job.CodeExitCode)
	if out.ExitCode == nil || *out.ExitCode != 3 {
		t.Errorf("exit code %v, want 3", out.ExitCode)
	}
	nothingLeft(t, inst, 0)
}

func testTimeout(t *testing.T, s *suite) {
	for _, tc := range []struct {
		name string
		prog Program
	}{
		{"heeds_SIGTERM", Program{Spawn(time.Minute), Echo(readyLine), Sleep(time.Minute)}},
		{"ignores_SIGTERM", Program{IgnoreTerm(), Spawn(time.Minute), Echo(readyLine), Sleep(time.Minute)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			inst, c := s.start(t, tc.prog)
			a := s.newAttempt(inst, c, func(r *job.Request) {
				d := job.Duration(Timeout)
				r.Timeout = &d
			})
			begin := time.Now()
			out := s.mustRun(t, context.Background(), a)
			took := time.Since(begin)
			s.wantFailure(t, out, job.StatusTimedOut, job.ClassTimeout, job.CodeAttemptTimeout)
			if ran := out.FinishedAt.Sub(out.StartedAt); ran < Timeout {
				t.Errorf("ran for %s, less than its timeout of %s", ran, Timeout)
			}
			if took > Timeout+Slack {
				t.Errorf("Run took %s for a timeout of %s", took, Timeout)
			}
			if !slices.Contains(a.report.stream("stdout"), readyLine) || !strings.Contains(out.Stdout, readyLine) {
				t.Errorf("the output before the timeout is lost: reported %q, tail %q", a.report.stream("stdout"), out.Stdout)
			}
			nothingLeft(t, inst, 0)
		})
	}
}

func testCancel(t *testing.T, s *suite) {
	inst, c := s.start(t, Program{IgnoreTerm(), Spawn(time.Minute), Echo(readyLine), Sleep(time.Minute)})
	a := s.newAttempt(inst, c, nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	cancelled := make(chan time.Time, 1)
	go func() {
		if a.report.waitLine(readyLine, lineWait) {
			cancelled <- time.Now()
			cancel(executor.ErrCancelled)
			return
		}
		cancelled <- time.Time{}
		cancel(errors.New("the attempt never printed its ready line"))
	}()
	out := s.mustRun(t, ctx, a)
	at := <-cancelled
	if at.IsZero() {
		t.Fatalf("the attempt never printed %q; got %s", readyLine, describe(out))
	}
	s.wantFailure(t, out, job.StatusCancelled, job.ClassCancelled, job.CodeCancelled)
	if !strings.Contains(out.Failure.Message, executor.ErrCancelled.Error()) {
		t.Errorf("message %q does not give the cause %q", out.Failure.Message, executor.ErrCancelled)
	}
	if took := time.Since(at); took > Slack {
		t.Errorf("Run returned %s after the cancel", took)
	}
	nothingLeft(t, inst, 0)
}

func testOOM(t *testing.T, s *suite) {
	// The sleep lets the container begin before it allocates: see the
	// Docker executor's oomKilled.
	inst, c := s.start(t, Program{Sleep(300 * time.Millisecond), Alloc(256 << 20), Sleep(10 * time.Second)})
	a := s.newAttempt(inst, c, func(r *job.Request) { r.Resources = &job.Resources{Memory: "16Mi"} })
	out := s.mustRun(t, context.Background(), a)
	s.wantFailure(t, out, job.StatusFailed, job.ClassOOM, job.CodeOOMKilled)
	if out.ExitCode != nil && *out.ExitCode != 137 {
		t.Errorf("exit code %d, want 137 (SIGKILL) or none", *out.ExitCode)
	}
	nothingLeft(t, inst, 0)
}

func testImageMissing(t *testing.T, s *suite) {
	inst, c := s.start(t, Program{Echo("never runs")})
	a := s.newAttempt(inst, c, nil)
	a.task.Request.Image, a.task.Request.PullPolicy = MissingImage, job.PullNever
	out, err := s.run(t, context.Background(), a)
	f := failureOf(out, err)
	if f == nil {
		t.Fatalf("Run = %+v, %v; want a failure of class image", out, err)
	}
	if f.Class != job.ClassImage || f.Code != job.CodeImageNotPresent || !strings.Contains(f.Message, MissingImage) {
		t.Errorf("failure %s/%s %q, want image/image_not_present naming %s", f.Class, f.Code, f.Message, MissingImage)
	}
	s.wantMessage(t, f)
	if out != nil && out.Status != job.StatusFailed {
		t.Errorf("status %s, want failed", out.Status)
	}
	if lines := a.report.stream("stdout"); len(lines) > 0 {
		t.Errorf("the job ran: %q", lines)
	}
	nothingLeft(t, inst, 0)
}

func testEnv(t *testing.T, s *suite) {
	inst, c := s.start(t, Program{
		EnvTo("GREETING", outputsDir("greeting")),
		EnvTo("EMPTY", outputsDir("empty")),
		EnvTo(WorkerSecretVar, outputsDir("worker")),
	})
	a := s.newAttempt(inst, c, func(r *job.Request) {
		r.Env["GREETING"] = "hello world"
		r.Env["EMPTY"] = ""
		r.Outputs = []string{"greeting", "empty", "worker"}
	})
	out := s.mustRun(t, context.Background(), a)
	if out.Status != job.StatusSucceeded {
		t.Fatalf("got %s, want succeeded", describe(out))
	}
	want := map[string]string{"greeting": "hello world", "empty": "", "worker": "<unset>"}
	if !maps.Equal(out.Outputs, want) {
		t.Errorf("the job saw %q, want %q (the worker's %s must not reach it)", out.Outputs, want, WorkerSecretVar)
	}
	nothingLeft(t, inst, 0)
}

func testWorkspace(t *testing.T, s *suite) {
	vars := []string{"FLEET_INPUTS", "FLEET_OUTPUTS", "FLEET_WORK", "FLEET_JOB_ID", "FLEET_ATTEMPT", "FLEET_POOL", "HOME"}
	prog := Program{Copy("$FLEET_INPUTS/deep/nested.txt", outputsDir("nested.txt"))}
	outputs := []string{"nested.txt", "pwd", "inputs-writable", "work-writable"}
	for _, v := range vars {
		prog = append(prog, EnvTo(v, outputsDir("var-"+v)))
		outputs = append(outputs, "var-"+v)
	}
	prog = append(prog, PwdTo(outputsDir("pwd")),
		Writable("$FLEET_INPUTS", outputsDir("inputs-writable")),
		Writable("$FLEET_WORK", outputsDir("work-writable")))
	inst, c := s.start(t, prog)
	a := s.newAttempt(inst, c, func(r *job.Request) {
		r.Inputs = map[string]string{"in.txt": "top", "deep/nested.txt": "nested input"}
		r.Outputs = outputs
		r.Workdir = "sub/dir"
	})
	out := s.mustRun(t, context.Background(), a)
	if out.Status != job.StatusSucceeded {
		t.Fatalf("got %s, want succeeded", describe(out))
	}
	o := out.Outputs
	check := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %q, want %q", what, got, want)
		}
	}
	check("nested input", o["nested.txt"], "nested input")
	check("FLEET_JOB_ID", o["var-FLEET_JOB_ID"], a.task.JobID)
	check("FLEET_ATTEMPT", o["var-FLEET_ATTEMPT"], fmt.Sprint(a.task.Attempt))
	check("FLEET_POOL", o["var-FLEET_POOL"], a.task.Pool)
	in, outs, work := o["var-FLEET_INPUTS"], o["var-FLEET_OUTPUTS"], o["var-FLEET_WORK"]
	if s.has(Container) {
		check("FLEET_INPUTS", in, "/fleet/inputs")
		check("FLEET_OUTPUTS", outs, "/fleet/outputs")
		check("FLEET_WORK", work, "/fleet/work")
	} else {
		// Folders of the worker's own: absolute, distinct, of one
		// workspace.
		for _, p := range []string{in, outs, work} {
			if !filepath.IsAbs(p) || filepath.Dir(p) != filepath.Dir(in) {
				t.Errorf("FLEET_INPUTS %q, FLEET_OUTPUTS %q, FLEET_WORK %q: want absolute folders of one workspace", in, outs, work)
				break
			}
		}
		if in == outs || in == work || outs == work {
			t.Errorf("FLEET_INPUTS %q, FLEET_OUTPUTS %q, FLEET_WORK %q are not distinct", in, outs, work)
		}
	}
	check("working directory", o["pwd"], path.Join(work, "sub/dir"))
	check("HOME", o["var-HOME"], work)
	check("work folder", o["work-writable"], "writable")
	t.Run("inputs_read_only", func(t *testing.T) {
		if why, lacks := s.b.Lacks[ReadOnlyInputs]; lacks {
			t.Skipf("not applicable to the %s executor, which lacks %q: %s (the job found its inputs %s)",
				s.b.Name, ReadOnlyInputs, why, o["inputs-writable"])
		}
		check("inputs folder", o["inputs-writable"], "read-only")
	})
	nothingLeft(t, inst, 0)
}

func testOutputLines(t *testing.T, s *suite) {
	inst, c := s.start(t, Program{Echo("first line"), Stderr("second line"), Echo("third line"), Stderr("fourth line")})
	a := s.newAttempt(inst, c, nil)
	out := s.mustRun(t, context.Background(), a)
	if out.Status != job.StatusSucceeded {
		t.Fatalf("got %s, want succeeded", describe(out))
	}
	stdout, stderr := []string{"first line", "third line"}, []string{"second line", "fourth line"}
	if !s.has(SeparateStderr) {
		stdout, stderr = []string{"first line", "second line", "third line", "fourth line"}, nil
	}
	if got := a.report.stream("stdout"); !slices.Equal(got, stdout) {
		t.Errorf("stdout lines reported: %q, want %q", got, stdout)
	}
	if got := a.report.stream("stderr"); !slices.Equal(got, stderr) {
		t.Errorf("stderr lines reported: %q, want %q", got, stderr)
	}
	tail := func(lines []string) string {
		if len(lines) == 0 {
			return ""
		}
		return strings.Join(lines, "\n") + "\n"
	}
	if out.Stdout != tail(stdout) || out.Stderr != tail(stderr) {
		t.Errorf("tails: stdout %q, stderr %q; want %q and %q", out.Stdout, out.Stderr, tail(stdout), tail(stderr))
	}
	nothingLeft(t, inst, 0)
}

func testRecover(t *testing.T, s *suite) {
	prog := OrphanProgram()
	crashed, c := s.start(t, prog)
	rec, ok := crashed.Executor.(executor.Recoverer)
	if !ok || crashed.Orphan == nil {
		t.Fatalf("the %s executor has Recover: it must implement executor.Recoverer (%t), and its Instance Orphan", s.b.Name, ok)
	}
	// Another worker, killed as well, whose attempt is not ours to settle.
	other, oc := s.start(t, prog)
	crashed.Orphan(t, &job.Request{ID: "orphan-" + random(), Env: c.Env()})
	other.Orphan(t, &job.Request{ID: "orphan-" + random(), Env: oc.Env()})
	if len(crashed.Left(t)) == 0 || len(other.Left(t)) == 0 {
		t.Fatalf("the killed workers left nothing behind (%q, %q): the orphans did not run", crashed.Left(t), other.Left(t))
	}
	t.Logf("the killed worker left: %s", strings.Join(crashed.Left(t), "; "))

	// The worker comes back with the same id: crashed.Executor is a new
	// executor in this process, the orphan's was in the killed one.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := rec.Recover(ctx, c.WorkerID); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	nothingLeft(t, crashed, 30*time.Second)
	if len(other.Left(t)) == 0 {
		t.Error("Recover settled another worker's attempt too")
	}
	// Twice changes nothing.
	if err := rec.Recover(ctx, c.WorkerID); err != nil {
		t.Errorf("Recover again: %v", err)
	}
	if err := other.Executor.(executor.Recoverer).Recover(ctx, oc.WorkerID); err != nil {
		t.Errorf("Recover of the other worker: %v", err)
	}
	nothingLeft(t, other, 30*time.Second)
}

func testValidate(t *testing.T, s *suite) {
	inst, c := s.start(t, Program{Echo("valid")})
	v, ok := inst.Executor.(executor.Validator)
	if !ok {
		t.Fatalf("the %s executor has Validate: it must implement executor.Validator", s.b.Name)
	}
	a := s.newAttempt(inst, c, nil)
	if err := v.Validate(a.task.Request); err != nil {
		t.Fatalf("Validate refuses what the backend runs: %v", err)
	}
	what := "no command"
	broken := s.newAttempt(inst, c, nil)
	if s.has(Container) {
		what, broken.task.Request.Image = "no image", ""
	} else {
		broken.task.Request.Command = nil
	}
	err := v.Validate(broken.task.Request)
	if err == nil || strings.TrimSpace(err.Error()) == "" {
		t.Fatalf("Validate accepts a request with %s (%v)", what, err)
	}
	t.Logf("Validate of a request with %s: %v", what, err)

	// Run refuses it as well, as a rejection, and runs nothing.
	var out *executor.Outcome
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = nil
				t.Errorf("Run of a request with %s panicked: %v", what, p)
			}
		}()
		out, err = s.run(t, context.Background(), broken)
	}()
	var f *job.Failure
	if !t.Failed() && (out != nil || !errors.As(err, &f) || f.Class != job.ClassRejected) {
		t.Errorf("Run of a request with %s = %+v, %v; want a failure of class rejected", what, out, err)
	}
	nothingLeft(t, inst, 0)
}
