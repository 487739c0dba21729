// Package executortest holds every executor to one contract. Run runs one
// table of behaviours, each a subtest, against an executor; each executor's
// own test package calls it with a Backend that says how to start that
// executor and what it can do:
//
//	func TestConformance(t *testing.T) {
//		executortest.Run(t, executortest.Backend{Name: "process", New: ..., Lacks: ...})
//	}
//
// A new executor is done when it passes the suite: add its conformance test
// beside the others (process, docker, kube, noop) and declare, with a
// reason, each ability it lacks.
//
// The behaviours, and the abilities they need (see Ability):
//
//   - success: an attempt that exits 0 succeeds, with its declared outputs
//     (Programs), exit code 0, StartedAt and FinishedAt;
//   - missing_output: a declared output the job did not write fails the
//     attempt, execution/output_missing (Programs);
//   - exit_code: a non-zero exit fails it, execution/exit_code, with the
//     code (Programs);
//   - timeout: the request's timeout stops it, timeout/attempt_timeout,
//     status timed_out, whether the job heeds SIGTERM or not (Programs);
//   - cancel: a ctx cancelled with executor.ErrCancelled stops it,
//     cancelled/cancelled (Programs);
//   - oom: a job over its memory limit fails oom/oom_killed (Programs, OOM);
//   - image_missing: an image absent from the host under pull policy never
//     fails image/image_not_present (Container);
//   - env: the job sees the request's env and none of the worker's own
//     (Programs);
//   - workspace: inputs, outputs and work where FLEET_INPUTS, FLEET_OUTPUTS
//     and FLEET_WORK say (/fleet/... in a container), the workdir under
//     work, HOME at work, FLEET_JOB_ID, FLEET_ATTEMPT, FLEET_POOL; inputs
//     read-only (ReadOnlyInputs) (Programs);
//   - output_lines: stdout and stderr lines reach the Reporter, in order,
//     and their tails are in the outcome (Programs; stderr apart: SeparateStderr);
//   - recover: what a killed worker left running is settled by the Recover
//     of a worker with its id, and another worker's is not (Recover);
//   - validate: Validate accepts what the backend runs and refuses what it
//     never can (no command; in a container, no image), and Run refuses it
//     too, without crashing (Validate);
//   - adopt: an attempt a killed worker left running is found running and
//     adopted to its end, with its outputs; one that ended while no worker
//     watched is settled from its exit code; one handed off (ErrLeaveRunning)
//     runs on and is adopted; RecoverAdoptable keeps what may be adopted
//     and removes the rest; what is gone is found gone (Adopt);
//   - persist: a job's data directory is the same for its attempts, in
//     FLEET_DATA, whichever executor of the backend runs them, and goes
//     with RemoveData (Persist);
//   - usage: while an attempt spins a CPU, Usage reads its memory,
//     processes and CPU (Usage).
//
// After every attempt the suite checks that nothing of it is left running
// (Instance.Left), that the outcome is consistent (a failure exactly when
// it did not succeed, with the status of its class; FinishedAt not before
// StartedAt), and that no env value of the request appears in the failure,
// the error, the reported phases or the executor's own logs.
//
// A behaviour that needs an ability the backend lacks is skipped as not
// applicable, with the backend's reason; a missing dependency (a Docker
// daemon, a control plane) is the backend's to require, through
// internal/testenv, so that it fails under CI=true.
package executortest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// An Ability is something a backend can do that not every backend can.
type Ability string

const (
	// Programs: the backend runs the job's program (or, for a simulated
	// node, plays it): exit codes, timeouts, cancels, outputs, the
	// environment and workspace the job sees, its output lines.
	Programs Ability = "programs"
	// SeparateStderr: stderr is kept apart from stdout. Without it, stderr lines
	// are reported and kept as stdout.
	SeparateStderr Ability = "stderr apart"
	// OOM: the backend enforces the memory a request asks for, and says
	// when it killed a job for it.
	OOM Ability = "memory limit"
	// Container: attempts run in a container image, which sees its
	// workspace at /fleet/inputs, /fleet/outputs and /fleet/work.
	Container Ability = "container"
	// ReadOnlyInputs: the job cannot write to its inputs.
	ReadOnlyInputs Ability = "read-only inputs"
	// Recover: the executor implements executor.Recoverer, and the Instance
	// can leave an orphan (Instance.Orphan).
	Recover Ability = "recover"
	// Validate: the executor implements executor.Validator.
	Validate Ability = "validate"
	// Adopt: the executor implements executor.Adopter, and the Instance
	// can leave an orphan (Instance.Orphan).
	Adopt Ability = "adopt"
	// Persist: the executor implements executor.DataKeeper: a job that asks
	// for it has a data directory that its attempts share.
	Persist Ability = "persist"
	// Usage: the executor implements executor.UsageReader and reads, while
	// an attempt runs, its memory, processes and CPU.
	Usage Ability = "usage"
)

var abilities = []Ability{Programs, SeparateStderr, OOM, Container, ReadOnlyInputs, Recover, Validate, Adopt, Persist, Usage}

// Backend is an executor under test.
type Backend struct {
	// Name names the executor in messages.
	Name string
	// New starts a fresh executor for one behaviour: for c, whose program
	// the attempts run. It may be called more than once for a behaviour
	// (recover starts two workers), and it requires what the backend needs
	// (a Docker daemon, a control plane) through internal/testenv.
	New func(t *testing.T, c *Case) *Instance
	// Lacks names each ability the backend does not have, and why. The
	// behaviours that need it are skipped as not applicable.
	Lacks map[Ability]string
	// Messages holds, by behaviour (the subtest's name below Run's test,
	// such as "exit_code", "timeout" or "timeout/ignores_SIGTERM"), what
	// the failure message of its attempts must contain: the backend's own
	// wording.
	Messages map[string]string
	// WorkerID returns a fresh worker id. Defaults to "conformance-" and a
	// random suffix.
	WorkerID func() string
}

// Case is what one behaviour asks of a backend.
type Case struct {
	// Behaviour is the subtest's name.
	Behaviour string
	// WorkerID is the worker whose attempts the instance runs.
	WorkerID string
	// Program is what the attempts run; nil for a backend without Programs.
	Program Program
	// Marker is an environment variable, NAME=VALUE, that every attempt of
	// the case carries, by which a backend may find what is left of its
	// attempts (a process's environment).
	Marker string
}

// Grace is the grace period between SIGTERM and SIGKILL a backend gives
// its executor in a case, so that the cases that wait it out (a job that
// ignores SIGTERM, a cancel) end soon. A job that heeds SIGTERM is given
// HeedingGrace instead: it never waits that out, and it must stop by its
// own SIGTERM handler however slow the machine is (Docker's chain from a
// kill to the container's exit took more than 500 ms with two make tests
// on this 2-core machine, and the case read as killed).
func (c *Case) Grace() time.Duration {
	if strings.HasSuffix(c.Behaviour, "/timeout/heeds_SIGTERM") {
		return HeedingGrace
	}
	return Grace
}

// The grace periods of Case.Grace.
const (
	Grace        = 500 * time.Millisecond
	HeedingGrace = 10 * time.Second
)

// Env is the environment that marks an attempt of the case: give it to
// the request of an orphan.
func (c *Case) Env() map[string]string {
	name, value, _ := strings.Cut(c.Marker, "=")
	return map[string]string{name: value}
}

// Instance is one executor started for a case.
type Instance struct {
	// Executor runs the case's attempts.
	Executor executor.Executor
	// Complete adds to a request what the backend needs to run the case's
	// program: the command, an image and its pull policy. The suite has set
	// the rest.
	Complete func(r *job.Request)
	// Left lists what of this instance's attempts is left: processes,
	// containers, Kubernetes Jobs and pods still running, workspaces on
	// the worker. Empty once an attempt has ended.
	Left func(t testing.TB) []string
	// Logs returns what the executor has logged, if the backend captures
	// it; the suite checks it for env values.
	Logs func() string
	// Orphan runs r, completed as Complete does, as attempt 1 of job r.ID
	// in another process, a worker with the case's worker id, and kills
	// that process (SIGKILL) once the attempt runs: what a crashed worker
	// leaves. Required with Recover and Adopt.
	Orphan func(t *testing.T, r *job.Request)
}

// Environment variables of the suite.
const (
	// WorkerSecretVar is set in the worker's environment while the suite
	// runs; no job may see it.
	WorkerSecretVar = "FLEET_CONFORMANCE_WORKER_SECRET"
	// SecretVar is in every request's env, with a value that must appear
	// in no failure, error, phase or log of the executor.
	SecretVar = "FLEET_CONFORMANCE_SECRET"
	// MarkerVar carries Case.Marker.
	MarkerVar = "FLEET_CONFORMANCE_CASE"
)

// MissingImage is an image that is on no host: "does-not-exist" in its name
// also makes the simulated Kubernetes node fail to pull it.
const MissingImage = "fleet-test/does-not-exist:1"

// Timeout is the request timeout of the timeout behaviour, and Slack how
// much longer than its timeout (or, on a cancel, than the cancel) an attempt
// may take to stop, grace period included.
const (
	Timeout = 2 * time.Second
	Slack   = 45 * time.Second
)

type behaviour struct {
	name  string
	needs []Ability
	test  func(t *testing.T, s *suite)
}

var behaviours = []behaviour{
	{"success", nil, testSuccess},
	{"missing_output", []Ability{Programs}, testMissingOutput},
	{"exit_code", []Ability{Programs}, testExitCode},
	{"timeout", []Ability{Programs}, testTimeout},
	{"cancel", []Ability{Programs}, testCancel},
	{"oom", []Ability{Programs, OOM}, testOOM},
	{"image_missing", []Ability{Container}, testImageMissing},
	{"env", []Ability{Programs}, testEnv},
	{"workspace", []Ability{Programs}, testWorkspace},
	{"output_lines", []Ability{Programs}, testOutputLines},
	{"recover", []Ability{Recover}, testRecover},
	{"validate", []Ability{Validate}, testValidate},
	{"adopt", []Ability{Programs, Adopt}, testAdopt},
	{"persist", []Ability{Programs, Persist}, testPersist},
	{"usage", []Ability{Programs, Usage}, testUsage},
}

// Run runs every behaviour against b, each a parallel subtest. It sets
// WorkerSecretVar in the environment for the whole run, so t must not be
// parallel.
func Run(t *testing.T, b Backend) {
	t.Helper()
	if b.Name == "" || b.New == nil {
		t.Fatal("executortest: a Backend needs a Name and New")
	}
	for a := range b.Lacks {
		if !slices.Contains(abilities, a) {
			t.Fatalf("executortest: %s lacks unknown ability %q", b.Name, a)
		}
	}
	for key := range b.Messages {
		first, _, _ := strings.Cut(key, "/")
		if !slices.ContainsFunc(behaviours, func(bh behaviour) bool { return bh.name == first }) {
			t.Fatalf("executortest: %s has a message for %q, which is no behaviour", b.Name, key)
		}
	}
	t.Setenv(WorkerSecretVar, "worker-secret-"+random())
	s := &suite{b: b}
	for _, bh := range behaviours {
		t.Run(bh.name, func(t *testing.T) {
			for _, a := range bh.needs {
				if why, lacks := b.Lacks[a]; lacks {
					if a == Recover || a == Validate || a == Adopt || a == Persist {
						s.checkLacks(t, a)
					}
					t.Skipf("not applicable to the %s executor, which lacks %q: %s", b.Name, a, why)
				}
			}
			t.Parallel()
			begin := time.Now()
			t.Cleanup(func() { t.Logf("%s: %s in %s", b.Name, bh.name, time.Since(begin).Round(time.Millisecond)) })
			bh.test(t, s)
		})
	}
}

type suite struct {
	b Backend
}

func (s *suite) has(a Ability) bool {
	_, lacks := s.b.Lacks[a]
	return !lacks
}

// checkLacks makes sure that a backend declaring it lacks Recover or
// Validate does not implement the interface, which the suite would then
// leave untested.
func (s *suite) checkLacks(t *testing.T, a Ability) {
	t.Helper()
	inst, _ := s.start(t, nil)
	_, recoverer := inst.Executor.(executor.Recoverer)
	_, validator := inst.Executor.(executor.Validator)
	_, adopter := inst.Executor.(executor.Adopter)
	_, keeper := inst.Executor.(executor.DataKeeper)
	if (a == Recover && recoverer) || (a == Validate && validator) || (a == Adopt && adopter) || (a == Persist && keeper) {
		t.Fatalf("the %s executor declares that it lacks %q, yet implements its interface: the suite must test it", s.b.Name, a)
	}
}

// start starts an instance for a case of the running behaviour.
func (s *suite) start(t *testing.T, prog Program) (*Instance, *Case) {
	t.Helper()
	if !s.has(Programs) {
		prog = nil
	}
	id := "conformance-" + random()
	if s.b.WorkerID != nil {
		id = s.b.WorkerID()
	}
	c := &Case{Behaviour: t.Name(), WorkerID: id, Program: prog, Marker: MarkerVar + "=" + random()}
	inst := s.b.New(t, c)
	if inst == nil || inst.Executor == nil || inst.Complete == nil || inst.Left == nil {
		t.Fatalf("the %s backend's New returned an incomplete Instance: Executor, Complete and Left are required", s.b.Name)
	}
	return inst, c
}

// attempt is one task of a case, and what the suite knows of it.
type attempt struct {
	inst   *Instance
	c      *Case
	task   *executor.Task
	report *recorder
	secret string
}

// newAttempt makes an attempt of the case: change sets the suite's part of
// the request, then the backend completes it.
func (s *suite) newAttempt(inst *Instance, c *Case, change func(r *job.Request)) *attempt {
	secret := "s3cret-" + random()
	r := &job.Request{Env: c.Env()}
	r.Env[SecretVar] = secret
	if change != nil {
		change(r)
	}
	inst.Complete(r)
	r.ID = job.DNSLabel("conf-"+path.Base(c.Behaviour), 40) + "-" + random()
	r.Pool = "conformance"
	r.Normalize()
	a := &attempt{inst: inst, c: c, report: &recorder{}, secret: secret}
	a.task = &executor.Task{JobID: r.ID, Attempt: 2, WorkerID: c.WorkerID, Pool: r.Pool, Request: r, Report: a.report}
	return a
}

// run runs the attempt and checks what every attempt must meet.
func (s *suite) run(t *testing.T, ctx context.Context, a *attempt) (*executor.Outcome, error) {
	t.Helper()
	out, err := a.inst.Executor.Run(ctx, a.task)
	s.checkSecret(t, a, out, err)
	if out != nil {
		checkOutcome(t, out)
	}
	return out, err
}

// mustRun runs the attempt, which must come to an outcome.
func (s *suite) mustRun(t *testing.T, ctx context.Context, a *attempt) *executor.Outcome {
	t.Helper()
	out, err := s.run(t, ctx, a)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if out == nil {
		t.Fatal("Run returned neither an outcome nor an error")
	}
	t.Logf("outcome: %s", describe(out))
	return out
}

// checkOutcome checks what holds for every outcome.
func checkOutcome(t *testing.T, out *executor.Outcome) {
	t.Helper()
	switch out.Status {
	case job.StatusSucceeded:
		if out.Failure != nil {
			t.Errorf("a success with a failure: %+v", out.Failure)
		}
	case job.StatusFailed, job.StatusTimedOut, job.StatusCancelled:
		if out.Failure == nil {
			t.Errorf("status %s without a failure", out.Status)
		} else if executor.StatusOf(out.Failure) != out.Status {
			t.Errorf("status %s for a failure of class %s, whose status is %s", out.Status, out.Failure.Class, executor.StatusOf(out.Failure))
		}
		if out.Failure != nil && strings.TrimSpace(out.Failure.Message) == "" {
			t.Errorf("failure %s/%s without a message", out.Failure.Class, out.Failure.Code)
		}
	default:
		t.Errorf("status %q is not an attempt's end", out.Status)
	}
	if !out.StartedAt.IsZero() && out.FinishedAt.Before(out.StartedAt) {
		t.Errorf("finished at %s, before it started at %s", out.FinishedAt, out.StartedAt)
	}
}

// checkSecret fails the test if the value of an env variable of the
// request reached what the executor itself says.
func (s *suite) checkSecret(t *testing.T, a *attempt, out *executor.Outcome, err error) {
	t.Helper()
	var where []string
	if out != nil && out.Failure != nil && strings.Contains(out.Failure.Message, a.secret) {
		where = append(where, "the failure message")
	}
	if err != nil && strings.Contains(err.Error(), a.secret) {
		where = append(where, "the error")
	}
	if slices.ContainsFunc(a.report.phaseList(), func(p string) bool { return strings.Contains(p, a.secret) }) {
		where = append(where, "a reported phase")
	}
	if a.inst.Logs != nil && strings.Contains(a.inst.Logs(), a.secret) {
		where = append(where, "the executor's logs")
	}
	if len(where) > 0 {
		t.Errorf("the value of env %s appears in %s", SecretVar, strings.Join(where, ", "))
	}
}

// nothingLeft fails the test unless nothing of the instance's attempts is
// left, at once or, with within, in that time.
func nothingLeft(t *testing.T, inst *Instance, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := inst.Left(t)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left behind: %s", strings.Join(left, "; "))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantFailure checks an outcome's status and failure, and its message
// against the backend's Messages.
func (s *suite) wantFailure(t *testing.T, out *executor.Outcome, status job.Status, class job.FailureClass, code job.FailureCode) {
	t.Helper()
	if out.Status != status || out.Failure == nil || out.Failure.Class != class || out.Failure.Code != code {
		t.Fatalf("got %s, want %s %s/%s", describe(out), status, class, code)
	}
	s.wantMessage(t, out.Failure)
}

// wantMessage checks a failure's message against the backend's Messages.
func (s *suite) wantMessage(t *testing.T, f *job.Failure) {
	t.Helper()
	_, name, _ := strings.Cut(t.Name(), "/")
	for key, want := range s.b.Messages {
		if (name == key || strings.HasPrefix(name, key+"/")) && !strings.Contains(f.Message, want) {
			t.Errorf("message %q, want it to contain %q", f.Message, want)
		}
	}
}

func describe(out *executor.Outcome) string {
	s := string(out.Status)
	if out.Failure != nil {
		s += fmt.Sprintf(" %s/%s %q", out.Failure.Class, out.Failure.Code, out.Failure.Message)
	}
	if out.ExitCode != nil {
		s += fmt.Sprintf(" exit %d", *out.ExitCode)
	}
	return s
}

// recorder is the Reporter of an attempt.
type recorder struct {
	mu     sync.Mutex
	lines  []Line
	phases []string
	// changed is closed and replaced at every line.
	changed chan struct{}
}

func (r *recorder) Log(stream, line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, Line{stream, line})
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

func (r *recorder) Phase(phase, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phases = append(r.phases, phase+": "+message)
}

func (r *recorder) phaseList() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.phases)
}

// stream returns the lines reported on stream.
func (r *recorder) stream(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var lines []string
	for _, l := range r.lines {
		if l.Stream == name {
			lines = append(lines, l.Text)
		}
	}
	return lines
}

// waitLine waits until line is reported on stdout, and says whether it was.
func (r *recorder) waitLine(line string, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		found := slices.ContainsFunc(r.lines, func(l Line) bool { return l.Stream == "stdout" && l.Text == line })
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		changed := r.changed
		r.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}

func random() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// failureOf returns the failure an attempt ended with: the outcome's, or
// the error's when it is a *job.Failure.
func failureOf(out *executor.Outcome, err error) *job.Failure {
	if out != nil && out.Failure != nil {
		return out.Failure
	}
	var f *job.Failure
	if errors.As(err, &f) {
		return f
	}
	return nil
}

// outputsDir is the path of name in the job's outputs.
func outputsDir(name string) string { return filepath.Join("$FLEET_OUTPUTS", name) }
