package docker

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/job"
)

// TestConformance holds the Docker executor to the executors' contract,
// running the test program in the test image on the local daemon.
func TestConformance(t *testing.T) {
	executortest.Run(t, executortest.Backend{
		// It has every ability.
		Name:     "docker",
		WorkerID: func() string { return runID + "-" + job.NewID()[20:] },
		Messages: map[string]string{
			"missing_output":          "declared outputs not written: [never.txt]",
			"exit_code":               "exited with code 3",
			"timeout/heeds_SIGTERM":   "ran longer than its timeout of 2s; stopped with SIGTERM",
			"timeout/ignores_SIGTERM": "ran longer than its timeout of 2s; killed with SIGKILL after a grace period of 500ms",
			"cancel":                  "job cancelled; killed with SIGKILL after a grace period of 500ms",
			"oom":                     "killed for exceeding its memory limit of 16Mi (exit code 137)",
			"image_missing":           "image " + executortest.MissingImage + " is not on the Docker host, and pull_policy is never",
		},
		New: func(t *testing.T, c *executortest.Case) *executortest.Instance {
			b := setup(t, Config{DataDir: dataDirOf(t), Grace: c.Grace()})
			b.worker = c.WorkerID
			return &executortest.Instance{
				Executor: b.exec,
				Complete: func(r *job.Request) { completeRequest(r, b.image, c.Program) },
				Left: func(t testing.TB) []string {
					var left []string
					for _, c := range b.containers(t) {
						left = append(left, fmt.Sprintf("container %s (%s)", c.Names, c.State))
					}
					entries, _ := os.ReadDir(b.dir)
					for _, e := range entries {
						left = append(left, "workspace "+e.Name())
					}
					return left
				},
				Logs: b.logs.String,
				Orphan: func(t *testing.T, r *job.Request) {
					r = r.Clone()
					completeRequest(r, b.image, c.Program)
					executortest.StartOrphan(t, orphan{WorkerID: c.WorkerID, Dir: b.dir, Request: r})
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

// completeRequest runs prog in the test image, which is never pulled.
func completeRequest(r *job.Request, image string, prog executortest.Program) {
	r.Image, r.PullPolicy = image, job.PullNever
	r.Command = append([]string{"/testprog"}, prog.Args()...)
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
	e, err := New(Config{Dir: o.Dir, Logger: slog.New(slog.DiscardHandler)})
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
