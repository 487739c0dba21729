package process

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

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
		executortest.Recover: "no process of an attempt outlives its worker's: the job is started with " +
			"Pdeathsig, and redelivery runs the job again",
	}
	if os.Geteuid() == 0 {
		lacks[executortest.ReadOnlyInputs] = "the worker runs as root, and so do its jobs, which file permissions do not bind: " +
			"inputs are read-only only for a worker that is not root"
	}
	executortest.Run(t, executortest.Backend{
		Name:  "process",
		Lacks: lacks,
		New: func(t *testing.T, c *executortest.Case) *executortest.Instance {
			dir := t.TempDir()
			e, err := New(Config{Dir: dir, Grace: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
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
			}
		},
	})
}

// processesWith lists the processes whose environment holds the variable
// marker ("NAME=VALUE"): the processes of an attempt, and whatever they
// started. A process that has exited, a zombie, has no environment left.
func processesWith(t testing.TB, marker string) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/environ")
	if err != nil {
		t.Fatal(err)
	}
	want := []byte(marker)
	var found []string
	for _, p := range procs {
		env, err := os.ReadFile(p)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, v := range bytes.Split(env, []byte{0}) {
			if bytes.Equal(v, want) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				found = append(found, fmt.Sprintf("process %d (%s)", pid, bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})))
				break
			}
		}
	}
	return found
}
