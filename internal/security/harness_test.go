// Package security_test runs the fleet against a NATS server started with
// the configuration shipped in deploy/nats, and checks that each role can
// do its work and nothing more; and that every way of authenticating to
// NATS that the commands offer works, TLS included.
package security_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/testport"
)

// shipped returns the path of a file of deploy/nats.
func shipped(t testing.TB, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "deploy", "nats", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// Role names, as in deploy/nats/fleet.conf.
const (
	roleDispatcher = "dispatcher"
	roleOperator   = "operator"
	// roleProducer is the producer of the default tenant.
	roleProducer = "producer-default"
)

// roleWorker names the worker role of a pool.
func roleWorker(pool string) string { return "worker-" + pool }

// roleTenant names the producer role of a tenant.
func roleTenant(tenant string) string { return "producer-" + tenant }

// shippedRoles are the users of the shipped fleet.conf: a key for each
// must be set before the server starts.
var shippedRoles = []string{roleDispatcher, roleOperator, roleProducer, roleWorker("default")}

// envName is the variable holding a role's public key, as gen-nkeys.sh and
// fleet.conf name it.
func envName(role string) string {
	return "FLEET_NKEY_" + strings.ToUpper(strings.NewReplacer("-", "_").Replace(role))
}

// keys holds the seed files of the roles, by role.
type keys map[string]string

// makeKeys creates a user key pair per role, writes each seed to a file
// readable only by its owner, and exports each public key in the variable
// the configuration reads.
func makeKeys(t testing.TB, roles ...string) keys {
	t.Helper()
	dir := t.TempDir()
	k := keys{}
	for _, role := range roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		path := filepath.Join(dir, role+".nk")
		if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv(envName(role), pub)
		k[role] = path
	}
	return k
}

// natsServer is an in-process server started from a configuration file.
type natsServer struct {
	*server.Server
	log  *serverLog
	conf string // the configuration file it runs
}

// startServer starts a server from a configuration file, on a free
// loopback port, with its JetStream files in the test's folder. It reads
// the environment when it parses the file: set the key variables first.
func startServer(t testing.TB, conf string, tweak ...func(*server.Options)) *natsServer {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats config %s: %v", conf, err)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPPort = 0
	opts.StoreDir = t.TempDir()
	opts.NoSigs = true
	opts.ServerName = "fleet-security-test"
	for _, f := range tweak {
		f(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	l := &serverLog{}
	s.SetLogger(l, false, opts.Trace)
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server did not start")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return &natsServer{Server: s, log: l, conf: conf}
}

// streamMsgs counts the messages of a stream of the FLEET account, read on
// the server: no role may look at every stream.
func (s *natsServer) streamMsgs(t testing.TB, stream string) uint64 {
	t.Helper()
	d, err := s.JszAccount(&server.JSzOptions{Account: "FLEET", Streams: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range d.Streams {
		if st.Name == stream {
			return st.State.Msgs
		}
	}
	t.Fatalf("no stream %s", stream)
	return 0
}

// url is the server's client URL.
func (s *natsServer) url() string { return s.ClientURL() }

// serverLog keeps the server's error lines: permission violations among
// them.
type serverLog struct {
	mu     sync.Mutex
	errors []string
	// ops are the publishes and subscriptions the server traced, with
	// Trace on: what each client did.
	ops []string
}

func (l *serverLog) Noticef(string, ...any) {}
func (l *serverLog) Warnf(string, ...any)   {}
func (l *serverLog) Fatalf(string, ...any)  {}
func (l *serverLog) Debugf(string, ...any)  {}
func (l *serverLog) Tracef(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	if !strings.Contains(line, "<<- [PUB ") && !strings.Contains(line, "<<- [HPUB ") && !strings.Contains(line, "<<- [SUB ") {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, line)
}
func (l *serverLog) Errorf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors = append(l.errors, fmt.Sprintf(format, v...))
}

// forget drops the violations logged on subject: those a test caused on
// purpose, once checked.
func (l *serverLog) forget(subject string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.errors[:0]
	for _, e := range l.errors {
		if !strings.Contains(e, `"`+subject+`"`) {
			kept = append(kept, e)
		}
	}
	l.errors = kept
}

// violations returns the permission violations the server logged.
func (l *serverLog) violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.errors {
		if strings.Contains(e, "Violation") {
			out = append(out, e)
		}
	}
	return out
}

// asyncErrors collects the asynchronous errors queue.Connect logs for a
// connection ("NATS error"), permission violations among them.
type asyncErrors struct {
	mu   sync.Mutex
	errs []string
	more chan struct{}
}

func newAsyncErrors() *asyncErrors { return &asyncErrors{more: make(chan struct{}, 1)} }

func (a *asyncErrors) add(s string) {
	a.mu.Lock()
	a.errs = append(a.errs, s)
	a.mu.Unlock()
	select {
	case a.more <- struct{}{}:
	default:
	}
}

func (a *asyncErrors) all() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.errs...)
}

// wait waits until an error containing every one of parts has arrived.
func (a *asyncErrors) wait(t testing.TB, parts ...string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		for _, e := range a.all() {
			if containsAll(e, parts...) {
				return
			}
		}
		select {
		case <-a.more:
		case <-deadline:
			t.Fatalf("no error containing %q; got %q", parts, a.all())
		}
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// captureHandler is a slog handler that hands the "err" attribute of the
// records queue.Connect logs for NATS errors to an asyncErrors, and keeps
// every line it is given for checks on what was logged.
type captureHandler struct {
	errs  *asyncErrors
	mu    *sync.Mutex
	lines *[]string
	attrs []slog.Attr
}

func newCapture() (*slog.Logger, *asyncErrors, func() []string) {
	h := &captureHandler{errs: newAsyncErrors(), mu: &sync.Mutex{}, lines: new([]string)}
	return slog.New(h), h.errs, func() []string {
		h.mu.Lock()
		defer h.mu.Unlock()
		return append([]string(nil), *h.lines...)
	}
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) WithGroup(string) slog.Handler            { return h }
func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	var errText string
	add := func(a slog.Attr) bool {
		line += " " + a.String()
		if a.Key == "err" {
			errText = a.Value.String()
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.mu.Lock()
	*h.lines = append(*h.lines, line)
	h.mu.Unlock()
	if r.Message == "NATS error" {
		h.errs.add(errText)
	}
	return nil
}

// conn is a client connection made through queue.Connect, with the
// asynchronous errors the server sent it.
type conn struct {
	*nats.Conn
	errs *asyncErrors
}

// connectAs connects as a role with its seed file, the way every command
// does with --nats-nkey.
func connectAs(t testing.TB, url string, k keys, role string) *conn {
	t.Helper()
	seed, ok := k[role]
	if !ok {
		t.Fatalf("no key for role %s", role)
	}
	return connect(t, queue.ConnConfig{URL: url, Name: role, NKeyFile: seed, InboxPrefix: inboxPrefix(role)})
}

// inboxPrefix is the prefix of a role's reply subjects, as fleet.conf
// allows them: _INBOX.dispatcher, _INBOX.operator,
// _INBOX.producer.<tenant>, _INBOX.worker.<pool>.
func inboxPrefix(role string) string {
	if pool, ok := strings.CutPrefix(role, "worker-"); ok {
		return "_INBOX.worker." + pool
	}
	if tenant, ok := strings.CutPrefix(role, "producer-"); ok {
		return "_INBOX.producer." + tenant
	}
	return "_INBOX." + role
}

func connect(t testing.TB, cc queue.ConnConfig) *conn {
	t.Helper()
	log, errs, _ := newCapture()
	cc.Logger = log
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := queue.Connect(ctx, cc)
	if err != nil {
		t.Fatalf("connect as %s: %v", cc.Name, err)
	}
	t.Cleanup(nc.Close)
	return &conn{Conn: nc, errs: errs}
}

func freePort(t testing.TB) int { return testport.Free(t) }
