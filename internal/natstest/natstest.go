// Package natstest runs a real NATS server with JetStream inside a test
// process, on a free loopback port, storing its files in the test's
// temporary folder.
package natstest

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/testport"
)

// Server is a running test server. Restart keeps its port and its files.
type Server struct {
	*server.Server
	t      testing.TB
	opts   server.Options
	tracer server.Logger // with Traced
}

// Options tweak the server before it starts.
type Option func(*server.Options)

// WithUser adds a user, its password and what it may publish and
// subscribe to (nil: anything). Once a server has a user, every client
// must name one (see ConnectAs).
func WithUser(name, password string, p *server.Permissions) Option {
	return func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: name, Password: password, Permissions: p})
	}
}

// Run starts a server that stops when the test ends.
func Run(t testing.TB, opts ...Option) *Server { return runServer(t, nil, opts) }

// Traced starts a server, as Run, that hands every line of its trace to
// tracer (what each client sends it, and what it delivers to each) from
// its first connection on.
func Traced(t testing.TB, tracer server.Logger, opts ...Option) *Server {
	return runServer(t, tracer, opts)
}

func runServer(t testing.TB, tracer server.Logger, opts []Option) *Server {
	t.Helper()
	o := server.Options{
		ServerName: "fleet-test",
		Host:       "127.0.0.1",
		Port:       freePort(t),
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoLog:      true,
		NoSigs:     true,
		MaxPayload: 8 << 20,
	}
	for _, f := range opts {
		f(&o)
	}
	s := &Server{t: t, opts: o, tracer: tracer}
	s.start()
	t.Cleanup(func() { s.Shutdown() })
	return s
}

func (s *Server) start() {
	s.t.Helper()
	o := s.opts
	ns, err := server.NewServer(&o)
	if err != nil {
		s.t.Fatalf("nats server: %v", err)
	}
	if s.tracer != nil {
		// Before the first client: a client traces what the server
		// traced when it connected.
		ns.SetLogger(s.tracer, false, true)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		s.t.Fatal("nats server did not start")
	}
	s.Server = ns
}

// URL is the client URL of the server.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port) }

// Restart stops the server and starts it again with the same port and
// files, as a crash and restart of the NATS server would.
func (s *Server) Restart() {
	s.t.Helper()
	s.Shutdown()
	s.WaitForShutdown()
	s.start()
}

// Connect returns a client connection closed when the test ends.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// ConnectAs returns a client connection as user name (see WithUser),
// closed when the test ends.
func (s *Server) ConnectAs(t testing.TB, name, password string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL(), nats.UserInfo(name, password), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect as %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func freePort(t testing.TB) int { return testport.Free(t) }
