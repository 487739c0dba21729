package process

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/job"
)

// TestConformance holds the process executor to the executors' contract,
// running the test program as a local process.
func TestConformance(t *testing.T) {
	prog := executortest.TestProgram(t)
	lacks := map[executortest.Ability]string{
		executortest.OOM:       "it sets no memory limit: a process job may use what the host has",
		executortest.Container: "it runs no image: jobs see their workspace where the worker made it",
		executortest.Adopt:     "a process dies with its worker (it is started with Pdeathsig): nothing is left to adopt",
	}
	if os.Geteuid() == 0 {
		lacks[executortest.ReadOnlyInputs] = "the worker runs as root, and so do its jobs, which file permissions do not bind: " +
			"inputs are read-only only for a worker that is not root"
	}
	executortest.Run(t, executortest.Backend{
		Name:  "process",
		Lacks: lacks,
		Messages: map[string]string{
			"missing_output":          "declared outputs not written: [never.txt]",
			"exit_code":               "exited with code 3",
			"timeout/heeds_SIGTERM":   "ran longer than its timeout of 2s; stopped with SIGTERM",
			"timeout/ignores_SIGTERM": "ran longer than its timeout of 2s; killed with SIGKILL after a grace period of 500ms",
			"cancel":                  "job cancelled; killed with SIGKILL after a grace period of 500ms",
		},
		New: func(t *testing.T, c *executortest.Case) *executortest.Instance {
			dir := t.TempDir()
			e, err := New(Config{Dir: dir, DataDir: dataDirOf(t), Grace: c.Grace()})
			if err != nil {
				t.Fatal(err)
			}
			// Whatever a failed behaviour leaves goes with the test.
			t.Cleanup(func() { killMarked(c.Marker) })
			return &executortest.Instance{
				Executor: e,
				Complete: func(r *job.Request) { r.Command = append([]string{prog}, c.Program.Args()...) },
				Left: func(t testing.TB) []string {
					left := processesWith(t, c.Marker)
					entries, _ := os.ReadDir(dir)
					for _, e := range entries {
						left = append(left, "workspace "+e.Name())
					}
					return left
				},
				Orphan: func(t *testing.T, r *job.Request) {
					r = r.Clone()
					r.Command = append([]string{prog}, c.Program.Args()...)
					executortest.StartOrphan(t, orphan{WorkerID: c.WorkerID, Dir: dir, Request: r})
				},
			}
		},
	})
}

// dataDirs holds the data folder of each behaviour, shared by the executors
// it starts, as the attempts of one worker share it.
var dataDirs sync.Map // *testing.T → string

func dataDirOf(t *testing.T) string {
	if d, ok := dataDirs.Load(t); ok {
		return d.(string)
	}
	d := t.TempDir()
	dataDirs.Store(t, d)
	t.Cleanup(func() { dataDirs.Delete(t) })
	return d
}

func TestMain(m *testing.M) {
	// The worker that the conformance suite's recover kills.
	executortest.MaybeOrphan(startOrphan)
	os.Exit(m.Run())
}

// orphan is the attempt of a worker that the test kills.
type orphan struct {
	WorkerID string
	Dir      string
	Request  *job.Request
}

// startOrphan is the killed worker's side of executortest.StartOrphan.
func startOrphan(spec []byte) (executor.Executor, *executor.Task, error) {
	var o orphan
	if err := json.Unmarshal(spec, &o); err != nil {
		return nil, nil, err
	}
	e, err := New(Config{Dir: o.Dir})
	if err != nil {
		return nil, nil, err
	}
	o.Request.Normalize()
	id := o.Request.ID
	if id == "" {
		id = "orphan"
	}
	return e, &executor.Task{JobID: id, Attempt: 1, WorkerID: o.WorkerID, Pool: "conformance", Request: o.Request}, nil
}

// killMarked kills the processes whose environment holds marker.
func killMarked(marker string) {
	for _, pid := range markedPIDs(marker) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// processesWith lists the processes whose environment holds the variable
// marker ("NAME=VALUE"): the processes of an attempt, and whatever they
// started. A process that has exited, a zombie, has no environment left.
func processesWith(t testing.TB, marker string) []string {
	t.Helper()
	var found []string
	for _, pid := range markedPIDs(marker) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		found = append(found, fmt.Sprintf("process %d (%s)", pid, bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})))
	}
	return found
}

func markedPIDs(marker string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	want := []byte(marker)
	var pids []int
	for _, p := range procs {
		env, err := os.ReadFile(p)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, v := range bytes.Split(env, []byte{0}) {
			if bytes.Equal(v, want) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}
