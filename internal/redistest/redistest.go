// Package redistest runs a real redis-server for tests, on a free loopback
// port, one per test, so that tests can stop and restart it.
package redistest

import (
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/testenv"
)

// Server is a redis-server process.
type Server struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	opts options
}

type options struct {
	password           string
	cert, key, caCerts string
}

// Option configures the server.
type Option func(*options)

// WithPassword requires AUTH with the password.
func WithPassword(pw string) Option { return func(o *options) { o.password = pw } }

// WithTLS serves TLS only, with the certificate and key files; clients are
// not asked for certificates.
func WithTLS(cert, key, ca string) Option {
	return func(o *options) { o.cert, o.key, o.caCerts = cert, key, ca }
}

// Start starts redis-server, or skips the test when it is not installed
// (fails it under CI=true). It stops when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	_, err := exec.LookPath("redis-server")
	testenv.Require(t, err == nil, "redis-server is not installed (apt-get install redis-server)")
	s := &Server{t: t, port: freePort(t), dir: t.TempDir()}
	for _, o := range opts {
		o(&s.opts)
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// URL is the server's URL: redis://, or rediss:// with TLS, with the
// password if there is one.
func (s *Server) URL() string {
	scheme, auth := "redis", ""
	if s.opts.cert != "" {
		scheme = "rediss"
	}
	if s.opts.password != "" {
		auth = ":" + s.opts.password + "@"
	}
	return fmt.Sprintf("%s://%s127.0.0.1:%d/0", scheme, auth, s.port)
}

// Addr is host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// Start (re)starts the server, empty, on the same port.
func (s *Server) Start() {
	s.t.Helper()
	args := []string{"--bind", "127.0.0.1", "--port", fmt.Sprint(s.port),
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "yes"}
	if s.opts.password != "" {
		args = append(args, "--requirepass", s.opts.password)
	}
	if s.opts.cert != "" {
		args[3] = "0" // no plain port
		args = append(args, "--tls-port", fmt.Sprint(s.port), "--tls-cert-file", s.opts.cert,
			"--tls-key-file", s.opts.key, "--tls-ca-cert-file", s.opts.caCerts, "--tls-auth-clients", "no")
	}
	s.cmd = exec.Command("redis-server", args...)
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
