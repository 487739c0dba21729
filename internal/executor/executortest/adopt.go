package executortest

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// adoptWait bounds the wait for an orphan to end by itself, and an
// adoption to follow it to its end.
const adoptWait = 90 * time.Second

// orphanRequest is the request of an orphan of case c: a job of its own.
func orphanRequest(c *Case, outputs ...string) *job.Request {
	return &job.Request{ID: job.DNSLabel("adopt-"+random(), 40), Env: c.Env(), Outputs: outputs}
}

// adoptTask is the task that adopts the orphan of r: attempt 1 of job r.ID,
// of the case's worker, with the request completed as the orphan's was.
func adoptTask(inst *Instance, c *Case, r *job.Request) (*executor.Task, *recorder) {
	req := r.Clone()
	inst.Complete(req)
	req.Pool = "conformance"
	req.Normalize()
	rep := &recorder{}
	return &executor.Task{JobID: req.ID, Attempt: 1, WorkerID: c.WorkerID, Pool: req.Pool, Request: req, Report: rep}, rep
}

func mustFind(t *testing.T, ad executor.Adopter, c *Case, jobID string, want executor.Standing) *executor.Found {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, err := ad.Find(ctx, executor.Query{JobID: jobID, Attempt: 1, Owner: c.WorkerID, Self: c.WorkerID})
	if err != nil {
		t.Fatalf("Find: %v", err)
	}
	if f.Standing != want {
		t.Fatalf("Find: %s (%s %s), want %s", f.Standing, f.Handle, f.Why, want)
	}
	return f
}

func adopter(t *testing.T, s *suite, inst *Instance) executor.Adopter {
	t.Helper()
	ad, ok := inst.Executor.(executor.Adopter)
	if !ok || inst.Orphan == nil {
		t.Fatalf("the %s executor has Adopt: it must implement executor.Adopter (%t), and its Instance Orphan", s.b.Name, ok)
	}
	return ad
}

func testAdopt(t *testing.T, s *suite) {
	t.Run("running", func(t *testing.T) {
		t.Parallel()
		inst, c := s.start(t, Program{Echo(readyLine), Sleep(4 * time.Second), Write(outputsDir("adopted.txt"), "adopted"), Echo("after")})
		ad := adopter(t, s, inst)
		r := orphanRequest(c, "adopted.txt")
		inst.Orphan(t, r)
		f := mustFind(t, ad, c, r.ID, executor.Running)
		t.Logf("found %s, started at %s", f.Handle, f.StartedAt)
		if f.Handle == "" {
			t.Error("Find names no handle of the attempt")
		}
		task, _ := adoptTask(inst, c, r)
		ctx, cancel := context.WithTimeout(context.Background(), adoptWait)
		defer cancel()
		out, err := ad.Adopt(ctx, task, f)
		if err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		checkOutcome(t, out)
		t.Logf("outcome: %s", describe(out))
		if out.Status != job.StatusSucceeded || out.ExitCode == nil || *out.ExitCode != 0 {
			t.Fatalf("got %s, want succeeded with exit code 0", describe(out))
		}
		if out.Outputs["adopted.txt"] != "adopted" {
			t.Errorf("outputs %q, want adopted.txt", out.Outputs)
		}
		if !f.StartedAt.IsZero() && !out.StartedAt.Equal(f.StartedAt) {
			t.Errorf("started at %s, but the attempt started at %s", out.StartedAt, f.StartedAt)
		}
		nothingLeft(t, inst, 30*time.Second)
		// Gone, or kept ended for a while (a Kubernetes Job's TTL): never
		// running again.
		if f, err := ad.Find(context.Background(), executor.Query{JobID: r.ID, Attempt: 1, Owner: c.WorkerID, Self: c.WorkerID}); err != nil ||
			(f.Standing != executor.Gone && f.Standing != executor.Ended) {
			t.Errorf("Find after the adoption: %+v, %v; want it gone or ended", f, err)
		}
	})

	t.Run("ended_while_no_worker_watched", func(t *testing.T) {
		t.Parallel()
		inst, c := s.start(t, Program{Echo(readyLine), Sleep(time.Second), Exit(3)})
		ad := adopter(t, s, inst)
		r := orphanRequest(c)
		inst.Orphan(t, r)
		deadline := time.Now().Add(adoptWait)
		var f *executor.Found
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			got, err := ad.Find(ctx, executor.Query{JobID: r.ID, Attempt: 1, Owner: c.WorkerID, Self: c.WorkerID})
			cancel()
			if err != nil {
				t.Fatalf("Find: %v", err)
			}
			if got.Standing == executor.Ended {
				f = got
				break
			}
			if got.Standing != executor.Running || time.Now().After(deadline) {
				t.Fatalf("Find: %s (%s), want it running, then ended", got.Standing, got.Why)
			}
			time.Sleep(200 * time.Millisecond)
		}
		task, _ := adoptTask(inst, c, r)
		out, err := ad.Adopt(context.Background(), task, f)
		if err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		checkOutcome(t, out)
		if out.Status != job.StatusFailed || out.ExitCode == nil || *out.ExitCode != 3 || out.Failure.Code != job.CodeExitCode {
			t.Fatalf("got %s, want the exit code 3 it ended with", describe(out))
		}
		nothingLeft(t, inst, 30*time.Second)
	})

	t.Run("handed_off", func(t *testing.T) {
		t.Parallel()
		inst, c := s.start(t, Program{Echo(readyLine), Sleep(3 * time.Second), Write(outputsDir("out.txt"), "kept")})
		ad := adopter(t, s, inst)
		a := s.newAttempt(inst, c, func(r *job.Request) { r.Outputs = []string{"out.txt"} })
		a.task.Attempt = 1
		ctx, cancel := context.WithCancelCause(context.Background())
		go func() {
			if a.report.waitLine(readyLine, lineWait) {
				cancel(executor.ErrLeaveRunning)
			} else {
				cancel(errors.New("the attempt never printed its ready line"))
			}
		}()
		out, err := s.run(t, ctx, a)
		if !errors.Is(err, executor.ErrLeftRunning) {
			t.Fatalf("Run on a hand-off: %v, %v; want ErrLeftRunning", out, err)
		}
		if len(inst.Left(t)) == 0 {
			t.Fatal("nothing of the handed-off attempt runs on")
		}
		f := mustFind(t, ad, c, a.task.JobID, executor.Running)
		out, err = ad.Adopt(context.Background(), a.task, f)
		if err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		if out.Status != job.StatusSucceeded || out.Outputs["out.txt"] != "kept" {
			t.Fatalf("got %s, outputs %q; want succeeded with out.txt", describe(out), out.Outputs)
		}
		nothingLeft(t, inst, 30*time.Second)
	})

	t.Run("recover_keeps_what_may_be_adopted", func(t *testing.T) {
		t.Parallel()
		inst, c := s.start(t, OrphanProgram())
		ad := adopter(t, s, inst)
		keep, drop := orphanRequest(c), orphanRequest(c)
		inst.Orphan(t, keep)
		inst.Orphan(t, drop)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var asked []string
		err := ad.RecoverAdoptable(ctx, c.WorkerID, func(_, jobID string, attempt int) bool {
			asked = append(asked, jobID)
			return jobID == keep.ID && attempt == 1
		})
		if err != nil {
			t.Fatalf("RecoverAdoptable: %v", err)
		}
		if !slices.Contains(asked, keep.ID) || !slices.Contains(asked, drop.ID) {
			t.Errorf("RecoverAdoptable asked about %q, want both orphans", asked)
		}
		mustFind(t, ad, c, keep.ID, executor.Running)
		deadline := time.Now().Add(30 * time.Second)
		for {
			f, err := ad.Find(ctx, executor.Query{JobID: drop.ID, Attempt: 1, Owner: c.WorkerID, Self: c.WorkerID})
			if err != nil {
				t.Fatalf("Find: %v", err)
			}
			if f.Standing == executor.Gone {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the attempt that may not be adopted is %s, want it gone", f.Standing)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := ad.RecoverAdoptable(ctx, c.WorkerID, func(string, string, int) bool { return false }); err != nil {
			t.Fatalf("RecoverAdoptable: %v", err)
		}
		nothingLeft(t, inst, 30*time.Second)
	})
}

func testPersist(t *testing.T, s *suite) {
	id := job.DNSLabel("persist-"+random(), 40)
	persist := func(r *job.Request) { r.Persist = &job.Persist{Enabled: true} }
	// Attempt 1 writes its checkpoint and fails; attempt 2, run by another
	// executor of the backend, reads it back.
	first, c1 := s.start(t, Program{Write("$FLEET_DATA/counter", "1"), Exit(1)})
	keeper, ok := first.Executor.(executor.DataKeeper)
	if !ok {
		t.Fatalf("the %s executor has Persist: it must implement executor.DataKeeper", s.b.Name)
	}
	a := s.newAttempt(first, c1, persist)
	a.task.JobID, a.task.Request.ID, a.task.Attempt = id, id, 1
	out := s.mustRun(t, context.Background(), a)
	if out.Status != job.StatusFailed || out.ExitCode == nil || *out.ExitCode != 1 {
		t.Fatalf("attempt 1: %s, want exit code 1", describe(out))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listed := func() bool {
		dirs, err := keeper.Data(ctx)
		if err != nil {
			t.Fatalf("Data: %v", err)
		}
		return slices.ContainsFunc(dirs, func(d executor.DataDir) bool { return d.JobID == id })
	}
	if !listed() {
		t.Fatalf("Data does not list the data directory of job %s after its first attempt", id)
	}

	second, c2 := s.start(t, Program{Copy("$FLEET_DATA/counter", outputsDir("counter"))})
	b := s.newAttempt(second, c2, func(r *job.Request) { persist(r); r.Outputs = []string{"counter"} })
	b.task.JobID, b.task.Request.ID, b.task.Attempt = id, id, 2
	out = s.mustRun(t, context.Background(), b)
	if out.Status != job.StatusSucceeded || out.Outputs["counter"] != "1" {
		t.Fatalf("attempt 2: %s, outputs %q; want the checkpoint of attempt 1", describe(out), out.Outputs)
	}
	if err := keeper.RemoveData(ctx, "", id); err != nil {
		t.Fatalf("RemoveData: %v", err)
	}
	if listed() {
		t.Errorf("the data directory of job %s is still listed after RemoveData", id)
	}
	if err := keeper.RemoveData(ctx, "", id); err != nil {
		t.Errorf("RemoveData twice: %v", err)
	}
	nothingLeft(t, first, 0)
	nothingLeft(t, second, 0)
}

func testUsage(t *testing.T, s *suite) {
	inst, c := s.start(t, Program{Echo(readyLine), Spin(8 * time.Second)})
	ur, ok := inst.Executor.(executor.UsageReader)
	if !ok {
		t.Fatalf("the %s executor has Usage: it must implement executor.UsageReader", s.b.Name)
	}
	a := s.newAttempt(inst, c, nil)
	done := make(chan *executor.Outcome, 1)
	go func() {
		out, _ := inst.Executor.Run(context.Background(), a.task)
		done <- out
	}()
	if !a.report.waitLine(readyLine, lineWait) {
		t.Fatal("the attempt never printed its ready line")
	}
	id := executor.AttemptID{JobID: a.task.JobID, Attempt: a.task.Attempt}
	var u *job.Usage
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		u = ur.Usage(context.Background())[id]
		if u != nil && u.CPUPercent != nil && u.MemoryBytes != nil && u.Pids != nil {
			break
		}
	}
	if u == nil || u.CPUPercent == nil || u.MemoryBytes == nil || u.Pids == nil {
		t.Fatalf("usage of the running attempt: %+v", u)
	}
	t.Logf("usage: cpu %.1f%%, memory %d, pids %d", *u.CPUPercent, *u.MemoryBytes, *u.Pids)
	// A spinning program uses some CPU, at most all of the machine's: how
	// much depends on the load beside it (CI saw 6.2% of a core with two
	// make tests on this 2-core machine), so only that it is some is held.
	if *u.CPUPercent <= 0 || *u.CPUPercent > float64(100*runtime.NumCPU())+1 || *u.MemoryBytes <= 0 || *u.Pids < 1 {
		t.Errorf("usage of a CPU spinner: cpu %.1f%%, memory %d, pids %d", *u.CPUPercent, *u.MemoryBytes, *u.Pids)
	}
	if u.ObservedAt.IsZero() {
		t.Error("usage without its time")
	}
	out := <-done
	if out == nil || out.Status != job.StatusSucceeded {
		t.Fatalf("the spinner: %v", out)
	}
	if u := ur.Usage(context.Background())[id]; u != nil {
		t.Errorf("usage of an attempt that ended: %+v", u)
	}
	nothingLeft(t, inst, 0)
}
