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
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
	if len(seen) < 40 {
		t.Errorf("50 ports picked, %d different: not at random", len(seen))
	}
}

func TestFreeGivesNoTakenPort(t *testing.T) {
	p := Free(t)
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
