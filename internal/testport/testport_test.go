package testport

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestFreeIsBelowTheEphemeralRange(t *testing.T) {
	high := ephemeralStart()
	seen := map[int]bool{}
	for range 50 {
		p := Free(t)
		if p < low || p >= high {
			t.Fatalf("port %d outside [%d, %d)", p, low, high)
		}
		if seen[p] {
			t.Fatalf("port %d given twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}

func TestFreeGivesNoTakenPort(t *testing.T) {
	p := Free(t)
	given.Lock()
	delete(given.ports, p) // as if another process had picked it
	given.Unlock()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got, err := free(p, p+1); err == nil {
		t.Fatalf("the one port of the range is taken, and free gave %d", got)
	}
	l.Close()
	if got, err := free(p, p+1); err != nil || got != p {
		t.Fatalf("the one port of the range is free again: %d, %v", got, err)
	}
}

// Two ports asked for one after the other, neither bound yet, are two.
func TestFreeGivesAPortOnce(t *testing.T) {
	p := Free(t)
	if got, err := free(p, p+1); err == nil {
		t.Fatalf("free gave %d twice", got)
	}
}

// A port given to one test binary is given to no other while the first
// runs: a child process (this test binary again) takes a port, and this
// one cannot have it, though nothing listens on it; once the child is
// gone, it can.
func TestFreeGivesNoPortOfAnotherProcess(t *testing.T) {
	if os.Getenv("TESTPORT_CHILD") != "" {
		fmt.Println(Free(t))
		_, _ = io.ReadAll(os.Stdin) // hold the port until the parent closes stdin
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreeGivesNoPortOfAnotherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TESTPORT_CHILD=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the child's port: %v", err)
	}
	p, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the child printed %q", line)
	}
	if got, err := free(p, p+1); err == nil {
		t.Fatalf("free gave %d, the port another test binary holds", got)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	if got, err := free(p, p+1); err != nil || got != p {
		t.Fatalf("the child is gone and port %d is free: free gave %d, %v", p, got, err)
	}
}
