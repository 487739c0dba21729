package executortest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// A Program is what a job of the suite does: steps of the test program
// (internal/dockertest/testprog), run in order. Paths in its steps may name
// the workspace by its variables ("$FLEET_OUTPUTS/out.txt"), which the
// test program expands, so that one program runs in a container and as a
// local process. A backend that runs no program of its own interprets the
// steps instead (see the Kubernetes executor's conformance test).
type Program []Step

// A Step is one verb of the test program and its arguments.
type Step struct {
	Verb string
	Args []string
}

// Verbs of the test program that the suite uses.
const (
	VerbEcho       = "echo"
	VerbStderr     = "stderr"
	VerbCopy       = "copy"
	VerbWrite      = "write"
	VerbEnvTo      = "env-to"
	VerbPwdTo      = "pwd-to"
	VerbWritable   = "writable"
	VerbIgnoreTerm = "ignore-term"
	VerbSpawn      = "spawn"
	VerbAlloc      = "alloc"
	VerbSleep      = "sleep"
	VerbExit       = "exit"
	VerbSpin       = "spin"
)

// Echo prints text on stdout.
func Echo(text string) Step { return Step{VerbEcho, []string{text}} }

// Stderr prints text on stderr.
func Stderr(text string) Step { return Step{VerbStderr, []string{text}} }

// Copy copies file src to dst.
func Copy(src, dst string) Step { return Step{VerbCopy, []string{src, dst}} }

// Write writes text to file path.
func Write(path, text string) Step { return Step{VerbWrite, []string{path, text}} }

// EnvTo writes the value of the variable name, or "<unset>", to file path.
func EnvTo(name, path string) Step { return Step{VerbEnvTo, []string{name, path}} }

// PwdTo writes the working directory to file path.
func PwdTo(path string) Step { return Step{VerbPwdTo, []string{path}} }

// Writable writes "writable" to file path if a file can be created in dir,
// "read-only" if not.
func Writable(dir, path string) Step { return Step{VerbWritable, []string{dir, path}} }

// IgnoreTerm ignores SIGTERM from then on.
func IgnoreTerm() Step { return Step{VerbIgnoreTerm, nil} }

// Spawn starts a copy of the program that sleeps for d in the background:
// something of the attempt that the job does not wait for.
func Spawn(d time.Duration) Step { return Step{VerbSpawn, []string{d.String()}} }

// Alloc allocates and touches n bytes of memory, and keeps them.
func Alloc(n int64) Step { return Step{VerbAlloc, []string{strconv.FormatInt(n, 10)}} }

// Sleep sleeps for d.
func Sleep(d time.Duration) Step { return Step{VerbSleep, []string{d.String()}} }

// Spin keeps one CPU busy for d.
func Spin(d time.Duration) Step { return Step{VerbSpin, []string{d.String()}} }

// Exit exits with code.
func Exit(code int) Step { return Step{VerbExit, []string{strconv.Itoa(code)}} }

// Args is the program as the test program's arguments.
func (p Program) Args() []string {
	var args []string
	for _, s := range p {
		args = append(args, s.Verb)
		args = append(args, s.Args...)
	}
	return args
}

// Line is one line a program prints.
type Line struct {
	Stream string // "stdout" or "stderr"
	Text   string
}

// Lines lists what the program prints, in order, up to where it ends.
func (p Program) Lines() []Line {
	var lines []Line
	for _, s := range p.run() {
		switch s.Verb {
		case VerbEcho:
			lines = append(lines, Line{"stdout", s.Args[0]})
		case VerbStderr:
			lines = append(lines, Line{"stderr", s.Args[0]})
		}
	}
	return lines
}

// End says how the program ends: after running for at least d (its
// sleeps), by exiting with code, or killed for its memory when oom is set
// (at its first allocation: the suite allocates only to be killed).
func (p Program) End() (d time.Duration, code int, oom bool) {
	for _, s := range p {
		switch s.Verb {
		case VerbSleep, VerbSpin:
			v, err := time.ParseDuration(s.Args[0])
			if err != nil {
				panic(fmt.Sprintf("executortest: sleep %q: %v", s.Args[0], err))
			}
			d += v
		case VerbExit:
			code, _ = strconv.Atoi(s.Args[0])
			return d, code, false
		case VerbAlloc:
			return d, 137, true
		}
	}
	return d, 0, false
}

// run is the steps the program gets to run: up to its exit or its
// allocation, included.
func (p Program) run() Program {
	for i, s := range p {
		if s.Verb == VerbExit || s.Verb == VerbAlloc {
			return p[:i+1]
		}
	}
	return p
}

// Files lists the steps that read or write files, up to where the program
// ends: what an interpreter of the program does to the workspace.
func (p Program) Files() []Step {
	var files []Step
	for _, s := range p.run() {
		switch s.Verb {
		case VerbCopy, VerbWrite, VerbEnvTo, VerbPwdTo, VerbWritable:
			files = append(files, s)
		}
	}
	return files
}

// TestProgram builds the test program for this machine into a temporary
// folder of t, removed when t ends, and returns its path.
func TestProgram(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "testprog")
	if err := BuildTestProgram(ctx, path, runtime.GOARCH); err != nil {
		t.Fatalf("build the test program: %v", err)
	}
	return path
}

// BuildTestProgram compiles the test program as a static Linux binary for
// arch at out.
func BuildTestProgram(ctx context.Context, out, arch string) error {
	// go test puts its own go first on the PATH.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out,
		"github.com/fleet-dev/fleet/internal/dockertest/testprog")
	// GOFLAGS may carry -race, which a static build cannot have.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build testprog: %w\n%s", err, msg)
	}
	return nil
}
