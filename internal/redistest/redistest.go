// Package redistest runs a real redis-server for tests, on a free loopback
// port, one per test, so that tests can stop and restart it.
package redistest

import (
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/fleettest"
)

// Server is a redis-server process.
type Server struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
}

// Start starts redis-server, or skips the test when it is not installed
// (fails it under CI=true). It stops when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	_, err := exec.LookPath("redis-server")
	fleettest.Require(t, err == nil, "redis-server is not installed (apt-get install redis-server)")
	s := &Server{t: t, port: freePort(t), dir: t.TempDir()}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.port) }

// Addr is host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// Start (re)starts the server, empty, on the same port.
func (s *Server) Start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", "--bind", "127.0.0.1", "--port", fmt.Sprint(s.port),
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "yes")
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.Dial("tcp", s.Addr())
		if err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("redis-server did not listen on %s", s.Addr())
}

// Stop kills the server; its data is gone.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
