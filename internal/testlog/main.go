// Command testlog reads what `go test -json` prints and writes what a plain
// `go test` would (each package's result, and the output of the tests that
// failed), and keeps how long each test took: with -times FILE it appends
// them there, and with -slowest N it prints the N slowest tests of FILE.
// It exits 1 when a test, a package or a build failed, or when the input
// ended with a package whose result never came (go test killed).
//
//	go test -json ./... | go run ./internal/testlog -times /tmp/times
//	go run ./internal/testlog -slowest 20 /tmp/times
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	times := flag.String("times", "", "append each test's time to this file")
	slowest := flag.Int("slowest", 0, "print the N slowest tests of the file named as the argument, and exit")
	flag.Parse()
	if *slowest > 0 {
		if err := printSlowest(os.Stdout, flag.Arg(0), *slowest); err != nil {
			fmt.Fprintln(os.Stderr, "testlog:", err)
			os.Exit(2)
		}
		return
	}
	r := newReport(os.Stdout)
	failed, err := r.read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(2)
	}
	if *times != "" {
		if err := r.appendTimes(*times); err != nil {
			fmt.Fprintln(os.Stderr, "testlog:", err)
			os.Exit(2)
		}
	}
	if failed {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (see go doc test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Elapsed    float64
	Output     string
}

// report turns events into plain output.
type report struct {
	out io.Writer
	// held is each running test's output, shown only if it fails.
	held map[string][]string
	// open are the packages started and not ended.
	open  map[string]bool
	times []timing
}

type timing struct {
	pkg, test string
	took      time.Duration
}

func newReport(out io.Writer) *report {
	return &report{out: out, held: map[string][]string{}, open: map[string]bool{}}
}

// read writes the plain output of the events in, and reports whether
// anything failed.
func (r *report) read(in io.Reader) (failed bool, err error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			// Not an event (go test's own complaint): as it came.
			fmt.Fprintln(r.out, sc.Text())
			continue
		}
		if r.take(e) {
			failed = true
		}
	}
	if err := sc.Err(); err != nil {
		return true, fmt.Errorf("read go test's output: %w", err)
	}
	for pkg := range r.open {
		fmt.Fprintf(r.out, "FAIL\t%s\t(no result: go test ended first)\n", pkg)
		r.flush(pkg)
		failed = true
	}
	return failed, nil
}

// take writes what e shows, and reports a failure.
func (r *report) take(e event) bool {
	key := e.Package + " " + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.out, e.Output)
	case e.Action == "build-fail":
		return true
	case e.Action == "start":
		r.open[e.Package] = true
	case e.Test == "" && e.Action == "output":
		// A passing package's own PASS line is not shown by a plain go
		// test; its ok line is.
		if e.Output != "PASS\n" {
			fmt.Fprint(r.out, e.Output)
		}
	case e.Test == "" && (e.Action == "pass" || e.Action == "skip" || e.Action == "fail"):
		delete(r.open, e.Package)
		if e.Action == "fail" {
			r.flush(e.Package)
			return true
		}
	case e.Action == "output":
		if !strings.HasPrefix(strings.TrimLeft(e.Output, " "), "=== ") {
			r.held[key] = append(r.held[key], e.Output)
		}
	case e.Action == "pass" || e.Action == "skip" || e.Action == "fail":
		lines := r.held[key]
		delete(r.held, key)
		parent, _, sub := cutLast(e.Test, "/")
		if !sub {
			r.times = append(r.times, timing{e.Package, e.Test, time.Duration(e.Elapsed * float64(time.Second))})
		}
		if e.Action != "fail" {
			return false
		}
		// As a plain go test shows it: the test's result line first, then
		// what it logged; a subtest's goes with its parent's.
		lines = resultFirst(lines, e.Test)
		if sub {
			pk := e.Package + " " + parent
			r.held[pk] = append(r.held[pk], lines...)
			return true
		}
		fmt.Fprint(r.out, strings.Join(lines, ""))
		return true
	}
	return false
}

// resultFirst moves test's own "--- FAIL: test" line to the front.
func resultFirst(lines []string, test string) []string {
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimLeft(l, " "), "--- FAIL: "+test+" ") {
			return append(append([]string{l}, lines[:i]...), lines[i+1:]...)
		}
	}
	return lines
}

// cutLast is strings.Cut at the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// flush writes the output held of pkg's tests that never ended (a panic,
// a timeout).
func (r *report) flush(pkg string) {
	keys := []string{}
	for k := range r.held {
		if strings.HasPrefix(k, pkg+" ") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprint(r.out, strings.Join(r.held[k], ""))
		delete(r.held, k)
	}
}

func (r *report) appendTimes(path string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, t := range r.times {
		fmt.Fprintf(w, "%.3f %s %s\n", t.took.Seconds(), t.pkg, t.test)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// printSlowest prints the n slowest tests that path lists.
func printSlowest(out io.Writer, path string, n int) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var ts []timing
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		s, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		ts = append(ts, timing{f[1], f[2], time.Duration(s * float64(time.Second))})
	}
	slices.SortFunc(ts, func(a, b timing) int { return cmp.Compare(b.took, a.took) })
	fmt.Fprintf(out, "the %d slowest of %d tests:\n", min(n, len(ts)), len(ts))
	for _, t := range ts[:min(n, len(ts))] {
		fmt.Fprintf(out, "%8.1fs  %s  %s\n", t.took.Seconds(), t.test, t.pkg)
	}
	return nil
}
