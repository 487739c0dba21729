package doctest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/doctest"
)

// page writes a Markdown page and returns its blocks.
func page(t *testing.T, text string) []doctest.Block {
	t.Helper()
	path := filepath.Join(t.TempDir(), "page.md")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	blocks, err := doctest.Parse(path)
	if err != nil {
		t.Fatal(err)
	}
	return blocks
}

func run(t *testing.T, blocks []doctest.Block, r *doctest.Runner) ([]doctest.Ran, error) {
	t.Helper()
	if r == nil {
		r = &doctest.Runner{}
	}
	if r.Dir == "" {
		r.Dir = t.TempDir()
	}
	r.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return r.Run(ctx, "page.md", blocks)
}

const fence = "```"

// TestAPageRunsInOneShell: the blocks run in order in one bash, in the
// scratch directory, so that an export, a variable and a process started
// in the background by a block are there for the next; a file= block is
// written before the blocks after it; the background process is stopped
// when the page ends.
func TestAPageRunsInOneShell(t *testing.T) {
	blocks := page(t, `# A page

`+fence+`sh
export GREETING=hello
sleep 300 &
echo $! > sleeper.pid
`+fence+`

Some text.

`+fence+`json file=doc.json
{"a": 1}
`+fence+`

`+fence+`sh
test "$GREETING" = hello
kill -0 "$(cat sleeper.pid)"   # still running
grep -q '"a": 1' doc.json
echo "in $PWD with $(command -v fake-tool)"
`+fence+`
`)
	dir := t.TempDir()
	bin := filepath.Join(dir, "tools")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "fake-tool"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, "scratch")
	if err := os.Mkdir(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	ran, err := run(t, blocks, &doctest.Runner{Dir: scratch, PATH: []string{bin}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) != 2 || ran[0].Block.Line != 3 || ran[1].Block.Line != 15 {
		t.Fatalf("ran %+v, want the blocks at lines 3 and 15", ran)
	}
	if want := "in " + scratch + " with " + filepath.Join(bin, "fake-tool"); !strings.Contains(ran[1].Output, want) {
		t.Errorf("the second block printed %q, want %q", ran[1].Output, want)
	}
	data, err := os.ReadFile(filepath.Join(scratch, "sleeper.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	if running(pid) {
		t.Errorf("the page's background process %d still runs after the page ended", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// running reports whether process pid runs: it exists and is not a zombie
// left for its adopter to reap.
func running(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	f := strings.Fields(string(data[i+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestAFailingBlockFailsThePage: the page fails at the first command that
// fails, under set -euo pipefail; the error names the page, the line of
// the command, the block's line and what the block printed; the blocks
// after it do not run.
func TestAFailingBlockFailsThePage(t *testing.T) {
	for _, tc := range []struct {
		name, block string
		line        int // of the page that the error names
		why         string
	}{
		{"a command", "echo before\nfalse\necho after", 9, "exit status 1"},
		{"a pipeline", "echo before\nfalse | cat\necho after", 9, "exit status 1"},
		// bash stops at once, without the ERR trap, and names the line.
		{"an unset variable", "echo before\necho \"$NO_SUCH_VARIABLE\"\necho after", 9, "exit status 1"},
		{"an exit code", "echo before\nsh -c 'exit 3'\necho after", 9, "exit status 3"},
		{"a command not found", "echo before\nno-such-command --flag\necho after", 9, "exit status 127"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blocks := page(t, "# A page\n\n"+fence+"sh\necho first\n"+fence+"\n\n"+fence+"sh\n"+tc.block+"\n"+fence+"\n\n"+fence+"sh\ntouch never\n"+fence+"\n")
			r := &doctest.Runner{Dir: t.TempDir()}
			ran, err := run(t, blocks, r)
			var e *doctest.Error
			if !errors.As(err, &e) {
				t.Fatalf("the page passed (%v), ran %+v", err, ran)
			}
			t.Logf("the error:\n%v", err)
			if e.Page != "page.md" || e.Block.Line != 7 || e.Line != tc.line {
				t.Errorf("the error names %s:%d, block %d; want page.md:%d, block 7", e.Page, e.Line, e.Block.Line, tc.line)
			}
			if !strings.Contains(e.Why, tc.why) {
				t.Errorf("why: %q, want %q", e.Why, tc.why)
			}
			if !strings.Contains(e.Output, "before") || strings.Contains(e.Output, "after") {
				t.Errorf("the block's output is %q: want its first line and not its last", e.Output)
			}
			if !strings.Contains(err.Error(), "page.md:") || !strings.Contains(err.Error(), "before") {
				t.Errorf("the message does not name the page or show the output:\n%v", err)
			}
			if len(ran) != 1 {
				t.Errorf("%d blocks ran to their end, want the first one only", len(ran))
			}
			if _, err := os.Stat(filepath.Join(r.Dir, "never")); err == nil {
				t.Error("the block after the failing one ran")
			}
		})
	}
}

// TestAMarkedBlockIsNotRun: a block whose first line is the mark, with a
// reason, is skipped, and the page passes.
func TestAMarkedBlockIsNotRun(t *testing.T) {
	blocks := page(t, "# A page\n\n"+fence+"sh\n"+doctest.SkipMark+" it needs a real cluster\nexit 1\n"+fence+"\n\n"+fence+"sh\necho ran\n"+fence+"\n")
	if blocks[0].Skip != "it needs a real cluster" {
		t.Fatalf("the reason read is %q", blocks[0].Skip)
	}
	ran, err := run(t, blocks, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) != 1 || ran[0].Block.Line != 8 || !strings.Contains(ran[0].Output, "ran") {
		t.Fatalf("ran %+v, want the second block only", ran)
	}
}

// TestBrokenRulesFailThePage: a block without an info string, a mark
// without a reason, a mark on a block that is never run and a file= out
// of the scratch directory are each a problem, and the page does not run.
func TestBrokenRulesFailThePage(t *testing.T) {
	blocks := page(t, "# A page\n\n"+fence+"\nmake test\n"+fence+"\n\n"+
		fence+"sh\n"+doctest.SkipMark+"\necho hi\n"+fence+"\n\n"+
		fence+"text\n"+doctest.SkipMark+" nothing to run\n"+fence+"\n\n"+
		fence+"json file=../x.json\n{}\n"+fence+"\n\n"+
		fence+"sh\ntouch ran\n"+fence+"\n")
	probs := doctest.Problems("page.md", blocks)
	for i, want := range []string{"page.md:3: a fenced block without an info string", "page.md:7: " + doctest.SkipMark + " without a reason",
		"page.md:12: " + doctest.SkipMark + " on a text block", "page.md:16: file=../x.json"} {
		if i >= len(probs) || !strings.HasPrefix(probs[i], want) {
			t.Errorf("problem %d: want %q, got %q", i, want, probs)
		}
	}
	if len(probs) != 4 {
		t.Errorf("%d problems, want 4: %q", len(probs), probs)
	}
	r := &doctest.Runner{Dir: t.TempDir()}
	if _, err := run(t, blocks, r); err == nil || !strings.Contains(err.Error(), "without an info string") {
		t.Errorf("the page ran: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.Dir, "ran")); err == nil {
		t.Error("a block of a page that breaks the rules ran")
	}
}

// TestABlockThatHangsFails: a block is bounded by BlockTimeout, and what
// it printed is in the error.
func TestABlockThatHangsFails(t *testing.T) {
	blocks := page(t, "# A page\n\n"+fence+"sh\necho waiting\nsleep 300\n"+fence+"\n")
	start := time.Now()
	_, err := run(t, blocks, &doctest.Runner{BlockTimeout: 500 * time.Millisecond})
	var e *doctest.Error
	if !errors.As(err, &e) || !strings.Contains(e.Why, "did not end within") || !strings.Contains(e.Output, "waiting") {
		t.Fatalf("want a timeout with the block's output, got %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the page took %s to fail", took)
	}
}

// TestTheEnvironmentIsThePages: the runner's FLEET_* variables do not
// reach the page, its Env does, and HOME is in the scratch directory.
func TestTheEnvironmentIsThePages(t *testing.T) {
	t.Setenv("FLEET_NATS_URL", "nats://elsewhere:4222")
	blocks := page(t, "# A page\n\n"+fence+"sh\ntest -z \"${FLEET_NATS_URL:-}\"\ntest \"$FLEET_TENANT\" = acme\ncase \"$HOME\" in \"$PWD\"/*) ;; *) exit 9 ;; esac\n"+fence+"\n")
	if _, err := run(t, blocks, &doctest.Runner{Env: []string{"FLEET_TENANT=acme"}}); err != nil {
		t.Fatal(err)
	}
}

// TestABackgroundProcessThatFailsFailsThePage: a process a block started
// in the background that exited non-zero before the page ended (a server
// that could not start) fails the page, naming its line.
func TestABackgroundProcessThatFailsFailsThePage(t *testing.T) {
	blocks := page(t, "# A page\n\n"+fence+"sh\necho starting\nsh -c 'echo cannot listen; exit 3' &\nsleep 30 &\n"+fence+"\n\n"+fence+"sh\nsleep 0.5\n"+fence+"\n")
	_, err := run(t, blocks, nil)
	var e *doctest.Error
	if !errors.As(err, &e) {
		t.Fatalf("the page passed: %v", err)
	}
	t.Logf("the error:\n%v", err)
	if e.Line != 5 || !strings.Contains(e.Why, "exit status 3") || !strings.Contains(e.Output, "cannot listen") {
		t.Errorf("the error names line %d (want 5), why %q, output %q", e.Line, e.Why, e.Output)
	}
}

// TestAtEndChecksWhatThePageStarted: AtEnd runs while the page's
// background processes still run, and its error fails the page.
func TestAtEndChecksWhatThePageStarted(t *testing.T) {
	blocks := page(t, "# A page\n\n"+fence+"sh\nsleep 30 &\necho $! > pid\n"+fence+"\n")
	r := &doctest.Runner{Dir: t.TempDir()}
	r.AtEnd = func(context.Context) error {
		data, err := os.ReadFile(filepath.Join(r.Dir, "pid"))
		if err != nil {
			return err
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		if !running(pid) {
			t.Errorf("the background process %d is gone before AtEnd", pid)
		}
		return errors.New("the server does not answer")
	}
	_, err := run(t, blocks, r)
	var e *doctest.Error
	if !errors.As(err, &e) || !strings.Contains(e.Why, "the server does not answer") {
		t.Fatalf("want AtEnd's error, got %v", err)
	}
}
