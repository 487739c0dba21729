package testport

import (
	"net"
	"strconv"
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
