// Package testport gives tests the TCP ports of the servers they start and
// restart: nats-server, redis-server, their clusters.
//
// A port found by listening on port 0 comes from the kernel's ephemeral
// range, the range it also takes the local end of every outgoing connection
// from. A test that kills a server and starts it again on its port two
// seconds later, while other test binaries open thousands of connections,
// may find that port taken by one of them, and the server cannot start:
// the test fails for nothing it tests. Free picks ports below that range,
// where the kernel hands out none; only another test picking the same one
// at random, among thousands, could take it.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// low is the first port Free picks from; the last is the one below the
// ephemeral range.
const low = 12000

// given holds the ports Free gave in this process: a test that asks for
// two ports (a server's and its HTTP API's) gets two, even before the
// first is bound. The kernel would give the same port twice, as port 0
// did: a port closed is the next one it hands out.
var given = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Free returns a loopback TCP port that is free now, that neither the
// kernel nor a listener on port 0 will hand out, and that Free has not
// given before in this process.
func Free(t testing.TB) int {
	t.Helper()
	p, err := free(low, ephemeralStart())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func free(lo, hi int) (int, error) {
	given.Lock()
	defer given.Unlock()
	var last error
	for range 100 {
		p := lo + rand.IntN(hi-lo)
		if given.ports[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			last = err
			continue
		}
		l.Close()
		given.ports[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("testport: no free port in [%d, %d) in 100 tries: %w", lo, hi, last)
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
