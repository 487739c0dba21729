// Package doctest runs the shell blocks of the repository's Markdown pages
// as the tests, the way Rust runs the examples of its documentation: a doc
// change that breaks an example fails the suite.
//
// The rules of a page (README.md, docs/*.md, deploy/**/README.md):
//
//   - Every fenced block says what it holds in its info string: sh, text,
//     json, go, yaml, … A block with none is a problem (see [Problems]).
//   - The sh blocks (also bash and shell) run in the order of the page, in
//     ONE bash process per page, under set -euo pipefail, so that an export
//     or a process started in the background by one block is there for the
//     next. They run in a scratch directory, with the folders of
//     [Runner.PATH] (the freshly built fleet binaries, the nats CLI…) first
//     on the PATH.
//   - A sh block whose first line is "# not run by the tests: <reason>" is
//     not run; the reason is required, and is there for the reader to see.
//   - A block of any language whose info string names a file
//     (```json file=schedule.json) is written to that file of the scratch
//     directory when the page reaches it, so that the page's commands use
//     the very document the page shows.
//   - Processes a page started in the background are stopped when it ends
//     (SIGTERM to the page's process group, SIGKILL 5 s later).
//
// A failure names the page, the line of the block (and of the command, when
// bash tells it) and what the block printed, with what the page's
// background processes printed.
package doctest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleet-dev/fleet/internal/doccheck"
)

// SkipMark starts the first line of a sh block that the tests do not run;
// the reason follows it.
const SkipMark = "# not run by the tests:"

// Block is a fenced block of a page.
type Block struct {
	// Lang is the first word of the info string: "sh", "text", "json"…
	Lang string
	// File is the file the block is written to (file=NAME in the info
	// string), or "".
	File string
	// Line is the line of the opening fence, counting from 1.
	Line int
	// Text is what the block holds.
	Text string
	// Skip is why the block is not run, from its SkipMark line; "" when it
	// runs.
	Skip string
	// Marked reports a SkipMark line, with or without a reason.
	Marked bool
}

// Shell reports whether the block is a shell block, which runs unless marked.
func (b Block) Shell() bool { return b.Lang == "sh" || b.Lang == "bash" || b.Lang == "shell" }

// Parse reads the fenced blocks of a Markdown page.
func Parse(path string) ([]Block, error) {
	p, err := doccheck.Parse(path)
	if err != nil {
		return nil, err
	}
	var out []Block
	for _, b := range p.Blocks {
		blk := Block{Lang: b.Info, Line: b.Line, Text: b.Text}
		for _, attr := range strings.Fields(b.Attrs) {
			if name, ok := strings.CutPrefix(attr, "file="); ok {
				blk.File = name
			}
		}
		first, _, _ := strings.Cut(b.Text, "\n")
		if reason, ok := strings.CutPrefix(strings.TrimSpace(first), SkipMark); ok {
			blk.Marked, blk.Skip = true, strings.TrimSpace(reason)
		}
		out = append(out, blk)
	}
	return out, nil
}

// Problems returns what breaks the rules in the blocks of page, each as
// "page:line: what": a block without an info string, a SkipMark without a
// reason or on a block that is not a shell block, a file= that leaves the
// scratch directory.
func Problems(page string, blocks []Block) []string {
	var out []string
	for _, b := range blocks {
		where := fmt.Sprintf("%s:%d", page, b.Line)
		switch {
		case b.Lang == "":
			out = append(out, where+": a fenced block without an info string: say what it holds (sh, text, json, go, yaml…)")
		case b.Marked && !b.Shell():
			out = append(out, where+": "+SkipMark+" on a "+b.Lang+" block, which is never run: drop the mark")
		case b.Marked && b.Skip == "":
			out = append(out, where+": "+SkipMark+" without a reason")
		}
		if b.File != "" && (filepath.IsAbs(b.File) || !filepath.IsLocal(b.File)) {
			out = append(out, fmt.Sprintf("%s: file=%s is not a file of the scratch directory", where, b.File))
		}
	}
	return out
}

// Runner runs pages.
type Runner struct {
	// Dir is the scratch directory, the page's working directory.
	Dir string
	// PATH are folders put first on the PATH, in order.
	PATH []string
	// Env is added to the environment (NAME=VALUE). The runner's own
	// environment is passed on without its FLEET_* and NATS_* variables,
	// and with HOME set to a folder of Dir.
	Env []string
	// BlockTimeout bounds each block; 2 minutes when zero.
	BlockTimeout time.Duration
	// Logf, when set, is told of each block as it ends.
	Logf func(format string, args ...any)
	// RunMarked, when set, runs the marked blocks whose reason it accepts
	// (to check a fix that a block waits for before its mark is dropped).
	RunMarked func(reason string) bool
	// AtEnd, when set, is called once every block has run, while what the
	// page started in the background still runs: it checks what the page
	// promises (its servers answer, its workers are live). An error fails
	// the page.
	AtEnd func(ctx context.Context) error
}

// Ran is what happened to one block.
type Ran struct {
	Block Block
	// Took is how long the block ran; zero for a block not run.
	Took time.Duration
	// Output is what the block printed, with what the processes it started
	// in the background printed until the page ended.
	Output string
}

// Error is a page that failed.
type Error struct {
	Page string
	// Block is the block that failed; Line the line of the page bash
	// named, or the block's.
	Block Block
	Line  int
	// Why is how it failed: an exit status, a timeout.
	Why string
	// Output is what the block printed; Background what the earlier
	// blocks' background processes printed.
	Output     string
	Background string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Block.Line == 0 {
		fmt.Fprintf(&b, "%s: %s\n", e.Page, e.Why)
	} else {
		fmt.Fprintf(&b, "%s:%d: %s (the sh block at line %d)\n", e.Page, e.Line, e.Why, e.Block.Line)
		fmt.Fprintf(&b, "--- the block:\n%s\n", e.Block.Text)
	}
	fmt.Fprintf(&b, "--- what it printed:\n%s", orNothing(e.Output))
	if e.Background != "" {
		fmt.Fprintf(&b, "--- what the page's earlier blocks and their background processes printed:\n%s", e.Background)
	}
	return b.String()
}

func orNothing(s string) string {
	if strings.TrimSpace(s) == "" {
		return "(nothing)\n"
	}
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s
}

// step is one block as the script runs it.
type step struct {
	block      Block
	scriptLine int // the script's line of the block's first line
}

// script writes the bash program of a page: each shell block, its output
// sent to a file of its own, between markers on fd 9; each file= block
// written out. It returns the steps in order.
func script(blocks []Block, outDir string, runMarked func(string) bool) (string, []step) {
	var b strings.Builder
	line := 1
	emit := func(s string) {
		b.WriteString(s)
		line += strings.Count(s, "\n")
	}
	emit("exec 9>&3 3>&-\n")
	emit("trap '__doctest_rc=$?; printf \"fail %d %d\\n\" \"$LINENO\" \"$__doctest_rc\" >&9' ERR\n")
	emit("set -euo pipefail\n")
	var steps []step
	for i, blk := range blocks {
		if blk.File != "" {
			eof := fmt.Sprintf("__DOCTEST_EOF_%d", i)
			emit(fmt.Sprintf("cat >%s <<'%s'\n%s\n%s\n", shellQuote(blk.File), eof, blk.Text, eof))
		}
		if !blk.Shell() || blk.Marked && (runMarked == nil || !runMarked(blk.Skip)) {
			continue
		}
		emit(fmt.Sprintf("printf 'begin %d %%s\\n' \"$EPOCHREALTIME\" >&9\n", blk.Line))
		emit("{\n")
		steps = append(steps, step{block: blk, scriptLine: line})
		emit(blk.Text + "\n")
		emit(fmt.Sprintf("} >%s 2>&1 </dev/null\n", shellQuote(filepath.Join(outDir, strconv.Itoa(blk.Line)+".log"))))
		emit(fmt.Sprintf("printf 'end %d %%s\\n' \"$EPOCHREALTIME\" >&9\n", blk.Line))
	}
	// What became of the processes started in the background.
	emit(fmt.Sprintf("jobs -l >%s\n", shellQuote(filepath.Join(outDir, "jobs"))))
	return b.String(), steps
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Run runs the blocks of page (a name for messages, such as "README.md")
// and returns what each did, and an *Error if one failed. The page's
// background processes are stopped before it returns.
func (r *Runner) Run(ctx context.Context, page string, blocks []Block) ([]Ran, error) {
	if r.Dir == "" {
		return nil, errors.New("doctest: no scratch directory")
	}
	if probs := Problems(page, blocks); len(probs) > 0 {
		return nil, errors.New(strings.Join(probs, "\n"))
	}
	work := filepath.Join(r.Dir, ".doctest")
	home := filepath.Join(r.Dir, ".home")
	for _, d := range []string{work, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	text, steps := script(blocks, work, r.RunMarked)
	scriptPath := filepath.Join(work, "page.sh")
	if err := os.WriteFile(scriptPath, []byte(text), 0o644); err != nil {
		return nil, err
	}
	statusPath := filepath.Join(work, "status")
	status, err := os.Create(statusPath)
	if err != nil {
		return nil, err
	}
	defer status.Close()

	cmd := exec.Command("bash", scriptPath)
	cmd.Dir = r.Dir
	cmd.Env = r.environ(home)
	cmd.ExtraFiles = []*os.File{status}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var shellOut bytes.Buffer // bash's own messages outside any block
	cmd.Stdout, cmd.Stderr = &shellOut, &shellOut
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("doctest: start bash: %w", err)
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer stopGroup(pgid)

	timeout := r.BlockTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	var (
		ran      []Ran
		current  = -1 // the index in steps of the block running
		started  time.Time
		waitErr  error
		exited   bool
		timedOut string
	)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	seen := 0
	advance := func() {
		data, _ := os.ReadFile(statusPath)
		lines := strings.Split(string(data), "\n")
		for ; seen < len(lines)-1; seen++ {
			f := strings.Fields(lines[seen])
			if len(f) < 2 {
				continue
			}
			switch f[0] {
			case "begin":
				current++
				started = stamp(f)
			case "end":
				blk := steps[current].block
				took := stamp(f).Sub(started)
				ran = append(ran, Ran{Block: blk, Took: took})
				if r.Logf != nil {
					r.Logf("%s:%d: ran in %s", page, blk.Line, took.Round(time.Millisecond))
				}
			}
		}
	}
loop:
	for {
		select {
		case waitErr = <-done:
			exited = true
			break loop
		case <-ctx.Done():
			timedOut = "the test's context ended: " + ctx.Err().Error()
			break loop
		case <-tick.C:
			advance()
			if current >= 0 && len(ran) == current && time.Since(started) > timeout {
				timedOut = fmt.Sprintf("the block did not end within %s", timeout)
				break loop
			}
		}
	}
	if !exited {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		waitErr = <-done
	}
	advance()
	var atEnd error
	if r.AtEnd != nil && timedOut == "" && waitErr == nil && len(ran) == len(steps) {
		atEnd = r.AtEnd(ctx)
	}
	// Stop the background processes before reading what they printed.
	stopGroup(pgid)
	for i := range ran {
		ran[i].Output = readLog(work, ran[i].Block.Line)
	}
	for _, blk := range blocks {
		if blk.Shell() && blk.Marked && (r.RunMarked == nil || !r.RunMarked(blk.Skip)) && r.Logf != nil {
			r.Logf("%s:%d: not run: %s", page, blk.Line, blk.Skip)
		}
	}
	if timedOut == "" && waitErr == nil && len(ran) == len(steps) {
		e := backgroundFailure(page, work, steps)
		if e == nil && atEnd != nil {
			e = &Error{Page: page, Why: "after its last block: " + atEnd.Error()}
		}
		if e == nil {
			return ran, nil
		}
		e.Background = backgroundOutput(page, ran)
		return ran, e
	}

	// The page failed: in the block that began and did not end, or before
	// any (bash's own message then says why).
	e := &Error{Page: page}
	switch {
	case timedOut != "":
		e.Why = timedOut
	case waitErr != nil:
		e.Why = "bash: " + waitErr.Error()
	default:
		e.Why = "bash ended before the page's last block"
	}
	if current < 0 || len(ran) > current {
		e.Why += ", outside any sh block"
	}
	data, _ := os.ReadFile(statusPath)
	failLine := 0
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "begin" {
			failLine = 0 // a failure is the running block's
		}
		if len(f) == 3 && f[0] == "fail" {
			n, _ := strconv.Atoi(f[1])
			failLine = n
			if timedOut == "" {
				e.Why = "exit status " + f[2]
			}
		}
	}
	if current >= 0 && current < len(steps) && len(ran) == current {
		s := steps[current]
		e.Block = s.block
		e.Line = s.block.Line
		if failLine >= s.scriptLine && failLine < s.scriptLine+strings.Count(s.block.Text, "\n")+1 {
			e.Line = s.block.Line + 1 + failLine - s.scriptLine
		}
		e.Output = readLog(work, s.block.Line)
		// bash's own messages name the script's lines: name the page's.
		lines := regexp.MustCompile(regexp.QuoteMeta(scriptPath) + `: line (\d+):`)
		e.Output = lines.ReplaceAllStringFunc(e.Output, func(m string) string {
			n, _ := strconv.Atoi(lines.FindStringSubmatch(m)[1])
			if n < s.scriptLine || n > s.scriptLine+strings.Count(s.block.Text, "\n") {
				return m
			}
			at := s.block.Line + 1 + n - s.scriptLine
			if failLine == 0 {
				e.Line = at
			}
			return fmt.Sprintf("%s:%d:", page, at)
		})
	}
	if msg := strings.TrimSpace(shellOut.String()); msg != "" {
		e.Output += "(bash:) " + msg + "\n"
	}
	e.Background = backgroundOutput(page, ran)
	return ran, e
}

// backgroundOutput is the end of what each block that ran printed, its
// background processes included.
func backgroundOutput(page string, ran []Ran) string {
	var bg strings.Builder
	for _, rr := range ran {
		if strings.TrimSpace(rr.Output) != "" {
			fmt.Fprintf(&bg, "[%s:%d]\n%s", page, rr.Block.Line, orNothing(tail(rr.Output, 40)))
		}
	}
	return bg.String()
}

// jobLine is a line of `jobs -l` for a process that exited non-zero:
// "[1]- 10532 Exit 3                  sh -c 'sleep 0.1; exit 3'".
var jobLine = regexp.MustCompile(`^\[\d+\][-+ ]?\s+\d+\s+Exit (\d+)\s+(.*)$`)

// backgroundFailure is a process that the page started in the background
// and that exited non-zero before the page ended (a dispatcher that could
// not start, say), or nil.
func backgroundFailure(page, work string, steps []step) *Error {
	data, _ := os.ReadFile(filepath.Join(work, "jobs"))
	for _, l := range strings.Split(string(data), "\n") {
		m := jobLine.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		e := &Error{Page: page, Why: fmt.Sprintf("a process it started in the background ended with exit status %s: %s", m[1], strings.TrimSpace(m[2]))}
		cmd := strings.TrimSuffix(strings.TrimSpace(m[2]), "&")
		cmd = strings.TrimSpace(cmd)
		for _, s := range steps {
			if i := strings.Index(s.block.Text, firstWords(cmd)); i >= 0 {
				e.Block = s.block
				e.Line = s.block.Line + 1 + strings.Count(s.block.Text[:i], "\n")
				e.Output = readLog(work, s.block.Line)
				break
			}
		}
		return e
	}
	return nil
}

// firstWords is the start of a command as jobs prints it, to find it in a
// block.
func firstWords(cmd string) string {
	f := strings.Fields(cmd)
	if len(f) > 2 {
		f = f[:2]
	}
	return strings.Join(f, " ")
}

// environ is the page's environment: the runner's, without the variables
// that would point the fleet's commands or the nats CLI elsewhere, with
// HOME in the scratch directory, PATH and Env.
func (r *Runner) environ(home string) []string {
	var env []string
	path := os.Getenv("PATH")
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "FLEET_") || strings.HasPrefix(name, "NATS_") ||
			name == "HOME" || name == "PATH" || name == "KUBECONFIG" || name == "XDG_CONFIG_HOME" {
			continue
		}
		env = append(env, kv)
	}
	if len(r.PATH) > 0 {
		path = strings.Join(r.PATH, string(os.PathListSeparator)) + string(os.PathListSeparator) + path
	}
	env = append(env, "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "PATH="+path)
	return append(env, r.Env...)
}

// stopGroup stops what is left of the page's process group: SIGTERM, then
// SIGKILL to what has not ended 5 s later.
func stopGroup(pgid int) {
	if syscall.Kill(-pgid, syscall.SIGTERM) != nil {
		return // nothing left
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !groupAlive(pgid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	for i := 0; i < 100 && groupAlive(pgid); i++ {
		time.Sleep(20 * time.Millisecond)
	}
}

// groupAlive reports whether a process of the group pgid still runs. An
// orphan that has exited stays a zombie until whoever adopted it reaps it
// (seconds, for some init processes): it does not count.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", p.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) >= 3 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			return true
		}
	}
	return false
}

// stamp is the time a status line says (bash's $EPOCHREALTIME, seconds
// with microseconds), or now.
func stamp(f []string) time.Time {
	if len(f) < 3 {
		return time.Now()
	}
	sec, err := strconv.ParseFloat(strings.Replace(f[2], ",", ".", 1), 64)
	if err != nil {
		return time.Now()
	}
	return time.UnixMicro(int64(sec * 1e6))
}

func readLog(dir string, line int) string {
	data, _ := os.ReadFile(filepath.Join(dir, strconv.Itoa(line)+".log"))
	return string(data)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("… (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
