// Package redistest runs real Redis servers for tests, on free loopback
// ports, one set per test, so that tests can stop and restart them: one
// server (Start), a master with a replica watched by three Sentinels
// (StartSentinel), or a Redis Cluster (StartCluster).
package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleet-dev/fleet/internal/testenv"
	"github.com/fleet-dev/fleet/internal/testport"
)

// Server is a redis-server process.
type Server struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	opts options
	// conf, when set, is the configuration file the server starts from
	// (a Sentinel's, which Sentinel rewrites).
	conf string
	// extra are more arguments (replication, cluster mode).
	extra []string
	// sentinel marks a Sentinel, whose password is opts.sentinelPassword.
	sentinel bool
}

type options struct {
	password           string
	sentinelPassword   string
	cert, key, caCerts string
}

// Option configures the server.
type Option func(*options)

// WithPassword requires AUTH with the password (on the Redis servers, not
// on Sentinels).
func WithPassword(pw string) Option { return func(o *options) { o.password = pw } }

// WithSentinelPassword makes the Sentinels of StartSentinel require AUTH
// with the password.
func WithSentinelPassword(pw string) Option { return func(o *options) { o.sentinelPassword = pw } }

// WithTLS serves TLS only, with the certificate and key files; clients are
// not asked for certificates. Replication, the cluster bus and Sentinels
// speak TLS too.
func WithTLS(cert, key, ca string) Option {
	return func(o *options) { o.cert, o.key, o.caCerts = cert, key, ca }
}

// require skips the test when redis-server (and redis-cli, for a Cluster)
// is not installed, or fails it under CI=true.
func require(t testing.TB, cli bool) {
	t.Helper()
	_, err := exec.LookPath("redis-server")
	testenv.Require(t, err == nil, "redis-server is not installed (apt-get install redis-server)")
	if cli {
		_, err := exec.LookPath("redis-cli")
		testenv.Require(t, err == nil, "redis-cli is not installed (apt-get install redis-tools)")
	}
}

// Start starts redis-server, or skips the test when it is not installed
// (fails it under CI=true). It stops when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	require(t, false)
	s := newServer(t, opts...)
	s.Start()
	return s
}

func newServer(t testing.TB, opts ...Option) *Server {
	s := &Server{t: t, port: freePort(t), dir: t.TempDir()}
	for _, o := range opts {
		o(&s.opts)
	}
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
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(args, "--bind", "127.0.0.1", "--port", fmt.Sprint(s.port),
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "yes")
	switch {
	case s.sentinel && s.opts.sentinelPassword != "":
		args = append(args, "--requirepass", s.opts.sentinelPassword)
	case !s.sentinel && s.opts.password != "":
		args = append(args, "--requirepass", s.opts.password, "--masterauth", s.opts.password)
	}
	if s.opts.cert != "" {
		args = append(args, "--port", "0", // no plain port
			"--tls-port", fmt.Sprint(s.port), "--tls-cert-file", s.opts.cert,
			"--tls-key-file", s.opts.key, "--tls-ca-cert-file", s.opts.caCerts, "--tls-auth-clients", "no",
			"--tls-replication", "yes", "--tls-cluster", "yes")
	}
	args = append(args, s.extra...)
	s.cmd = exec.Command("redis-server", args...)
	s.cmd.Dir = s.dir
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

// Stop kills the server (SIGKILL); its data is gone.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill() // a frozen server dies of SIGKILL too
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Freeze stops the server with SIGSTOP: its port stays open and accepts
// connections, but nothing answers, as when a host or a network path
// vanishes without a reset. Thaw resumes it.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatalf("redis-server on %s is not running", s.Addr())
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal redis-server: %v", err)
	}
}

// Running reports whether the server was started and not stopped.
func (s *Server) Running() bool { return s.cmd != nil }

// options are the go-redis options of a client of this server, for the
// helpers that watch it: TLS and the password as it is configured.
func (s *Server) clientOptions() *redis.Options {
	o := &redis.Options{Addr: s.Addr(), DialTimeout: time.Second, MaxRetries: -1, Password: s.opts.password}
	if s.sentinel {
		o.Password = s.opts.sentinelPassword
	}
	if s.opts.cert != "" {
		pem, err := os.ReadFile(s.opts.caCerts)
		if err != nil {
			s.t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		o.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return o
}

func freePort(t testing.TB) int { return testport.Free(t) }
