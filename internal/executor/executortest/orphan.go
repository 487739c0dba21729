package executortest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
)

// A crashed worker is simulated by a process of its own: the test binary,
// started again by StartOrphan as a worker that runs one attempt and is
// killed with SIGKILL once the attempt runs. The test binary's TestMain
// hands such a process over with MaybeOrphan before it runs any test:
//
//	func TestMain(m *testing.M) {
//		executortest.MaybeOrphan(startOrphan)
//		os.Exit(m.Run())
//	}
//
// startOrphan builds, from the spec that the test gave StartOrphan, the
// executor of the killed worker and the attempt it runs.

// orphanEnv carries the spec of the orphan's worker.
const orphanEnv = "FLEET_EXECUTORTEST_ORPHAN"

// orphanLife is how long an orphan's attempt would run if nothing ended it.
const orphanLife = 5 * time.Minute

// orphanRunning is what the orphan's worker prints once its attempt runs.
const orphanRunning = "orphan running"

// OrphanProgram is what an orphan runs: it prints the ready line once it
// runs, and leaves a process of its own besides.
func OrphanProgram() Program {
	return Program{Spawn(orphanLife), Echo(readyLine), Sleep(orphanLife)}
}

// StartOrphan starts the test binary as a worker that runs the attempt spec
// describes (JSON-encoded for the MaybeOrphan of the binary's TestMain),
// waits until the attempt prints its ready line, and kills the worker.
func StartOrphan(t *testing.T, spec any) {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatalf("orphan spec: %v", err)
	}
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), orphanEnv+"="+string(data))
	child.Stderr = os.Stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatalf("start the orphan's worker: %v", err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	}()
	said := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if l := s.Text(); l == orphanRunning || strings.HasPrefix(l, "error: ") {
				said <- l
				return
			}
		}
		said <- "error: the worker ended: " + fmt.Sprint(s.Err())
	}()
	select {
	case l := <-said:
		if l != orphanRunning {
			t.Fatalf("the orphan's worker: %s", l)
		}
	case <-t.Context().Done():
		t.Fatal("the test ended before the orphan ran")
	case <-time.After(lineWait):
		t.Fatalf("the orphan's attempt did not run within %s", lineWait)
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	killed = true
}

// MaybeOrphan returns at once unless this process was started by
// StartOrphan. Then it is the orphan's worker: it runs the attempt that
// start builds from the spec, says so once the attempt prints its ready
// line, and waits to be killed. It exits if anything goes wrong.
func MaybeOrphan(start func(spec []byte) (executor.Executor, *executor.Task, error)) {
	spec := os.Getenv(orphanEnv)
	if spec == "" {
		return
	}
	e, task, err := start([]byte(spec))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	r := &recorder{}
	task.Report = r
	go func() {
		if r.waitLine(readyLine, lineWait) {
			fmt.Println(orphanRunning)
		}
	}()
	out, err := e.Run(context.Background(), task)
	if out != nil {
		fmt.Printf("error: the attempt ended: %s\n", describe(out))
	} else {
		fmt.Printf("error: the attempt ended: %v\n", err)
	}
	os.Exit(1)
}
