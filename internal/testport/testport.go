// Package testport gives tests the TCP ports of the servers they start and
// restart: nats-server, redis-server, their clusters, the Kubernetes
// control plane.
//
// A port found by listening on port 0 comes from the kernel's ephemeral
// range, the range it also takes the local end of every outgoing connection
// from. A test that kills a server and starts it again on its port
// seconds later, while other test binaries open thousands of connections,
// may find that port taken by one of them, and the server cannot start:
// the test fails for nothing it tests. Free picks ports below that range,
// where the kernel hands out none.
//
// Nor does another test binary get the port: each port given is claimed
// in a lock file shared by every process of the machine (a byte-range
// lock on the byte at the port's offset), held until the process ends.
// A port freed by a killed server, waiting to be taken again by the same
// server, is still claimed, and no other test binary picks it meanwhile.
package testport

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// low is the first port Free picks from; the last is the one below the
// ephemeral range.
const low = 12000

// LockPath is the file in which the ports are claimed: a fixed path, so
// that test binaries run with different TMPDIRs still see each other's
// claims.
const LockPath = "/tmp/fleet-testports.lock"

// given holds the ports Free gave in this process: a test that asks for
// two ports (a server's and its HTTP API's) gets two, even before the
// first is bound. The kernel would give the same port twice, as port 0
// did: a port closed is the next one it hands out. (The byte-range lock
// does not tell: a process's own locks never conflict with each other.)
var given = struct {
	sync.Mutex
	ports map[int]bool
	lock  *os.File // nil until opened; opened once and never closed
	err   error    // why the lock file could not be opened
	once  bool
}{ports: map[int]bool{}}

// Free returns a loopback TCP port that is free now, that neither the
// kernel nor a listener on port 0 will hand out, and that no test binary
// of this machine has been given while it runs, this one included.
func Free(t testing.TB) int {
	t.Helper()
	p, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Pick is Free for code with no testing.TB at hand.
func Pick() (int, error) { return free(low, ephemeralStart()) }

func free(lo, hi int) (int, error) {
	given.Lock()
	defer given.Unlock()
	lock, err := lockFile()
	if err != nil {
		return 0, err
	}
	var last error
	for range 200 {
		p := lo + rand.IntN(hi-lo)
		if given.ports[p] {
			continue
		}
		if ok, err := claim(lock, p); err != nil {
			return 0, err
		} else if !ok {
			last = fmt.Errorf("port %d: claimed by another test binary", p)
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			unclaim(lock, p)
			last = err
			continue
		}
		l.Close()
		given.ports[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("testport: no free port in [%d, %d) in 200 tries: %w", lo, hi, last)
}

// lockFile opens LockPath the first time it is asked for. Called with
// given held.
func lockFile() (*os.File, error) {
	if !given.once {
		given.once = true
		if err := os.MkdirAll(filepath.Dir(LockPath), 0o1777); err != nil {
			given.err = err
		} else {
			given.lock, given.err = os.OpenFile(LockPath, os.O_RDWR|os.O_CREATE, 0o666)
		}
		if given.err != nil {
			given.err = fmt.Errorf("testport: open the ports' lock file: %w", given.err)
		}
	}
	return given.lock, given.err
}

// claim takes the lock of port p's byte without waiting: false if another
// process holds it. The lock lasts until this process ends.
func claim(f *os.File, p int) (bool, error) {
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(p), Len: 1}
	err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EACCES):
		return false, nil
	default:
		return false, fmt.Errorf("testport: lock port %d in %s: %w", p, LockPath, err)
	}
}

func unclaim(f *os.File, p int) {
	lk := syscall.Flock_t{Type: syscall.F_UNLCK, Whence: io.SeekStart, Start: int64(p), Len: 1}
	_ = syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk)
}

// ephemeralStart is the first port of the kernel's ephemeral range
// (Linux's default, 32768, where it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= low+1000 {
		return 32768
	}
	return n
}
