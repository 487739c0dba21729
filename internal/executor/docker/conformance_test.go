package docker

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/fleet-dev/fleet/internal/dockertest"
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
			b := setup(t, Config{})
			b.worker = c.WorkerID
			return &executortest.Instance{
				Executor: b.exec,
				Complete: func(r *job.Request) { completeRequest(r, c.Program) },
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
				Orphan: func(t *testing.T) {
					r := &job.Request{Env: c.Env()}
					completeRequest(r, c.Program)
					executortest.StartOrphan(t, orphan{WorkerID: c.WorkerID, Dir: b.dir, Request: r})
				},
			}
		},
	})
}

// completeRequest runs prog in the test image, which is never pulled.
func completeRequest(r *job.Request, prog executortest.Program) {
	r.Image, r.PullPolicy = dockertest.Image, job.PullNever
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
	return e, &executor.Task{JobID: "orphan", Attempt: 1, WorkerID: o.WorkerID, Pool: "default", Request: o.Request}, nil
}
