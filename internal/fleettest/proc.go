package fleettest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/testenv"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// Binary returns the path of a fleet command (dispatcher, worker,
// fleetctl), built once per test binary from the module's source.
func Binary(t testing.TB, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		buildDir, buildErr = testenv.ProcessDir("fleet-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+"/", "./cmd/dispatcher", "./cmd/worker", "./cmd/fleetctl")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, name)
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the module")
	}
	return filepath.Dir(mod), nil
}

// Proc is a fleet process started by a test.
type Proc struct {
	Cmd  *exec.Cmd
	name string
	out  *SyncBuffer
	done chan struct{}
	err  error
}

// StartProc starts a built command with args and extra environment; it is
// killed when the test ends, and its output is shown if the test failed.
//
// A dispatcher runs contract v2 alone (--v1=false), as in production,
// unless args say otherwise.
func StartProc(t testing.TB, name string, env []string, args ...string) *Proc {
	t.Helper()
	if name == "dispatcher" && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--v1") }) {
		args = append(args, "--v1=false")
	}
	cmd := exec.Command(Binary(t, name), args...)
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{Cmd: cmd, name: name, out: &SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- output of %s (pid %d):\n%s", name, cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

// Kill sends SIGKILL and waits for the process to end.
func (p *Proc) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Signal sends a signal.
func (p *Proc) Signal(s os.Signal) { _ = p.Cmd.Process.Signal(s) }

// Wait waits for the process to end, up to d; it reports whether it ended.
func (p *Proc) Wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// Output returns what the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// WaitOutput waits until the output contains s.
func (p *Proc) WaitOutput(t testing.TB, s string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if strings.Contains(p.out.String(), s) {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before printing %q:\n%s", p.name, p.err, s, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not print %q within %s:\n%s", p.name, s, d, p.out.String())
}

// SyncBuffer is a buffer that processes write into while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
