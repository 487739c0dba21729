package natstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/testenv"
)

// Cluster is a JetStream cluster of real nats-server processes on loopback,
// each with its own ports and store in the test's temporary folder, so that
// a test can SIGKILL a node and start it again. Everything is killed when
// the test ends, and the servers' logs are shown if it failed.
type Cluster struct {
	t     testing.TB
	name  string
	nodes []*node
	// standalone: one server, not clustered (no routes, no Raft), as a
	// fleet on a single machine runs it.
	standalone bool

	mu sync.Mutex
	nc *nats.Conn // for the harness's own JetStream API requests
}

type node struct {
	name                 string
	client, route, httpP int
	dir, conf, log       string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// logFrom is where the running process's lines begin in log; exit
	// is how it ended, once done is closed.
	logFrom int64
	exit    error
	// kills are when the test killed it.
	kills []time.Time
}

var (
	serverOnce sync.Once
	serverBin  string
	serverErr  error
)

// ServerBinary returns the path of a nats-server built once per test binary
// from the version of github.com/nats-io/nats-server/v2 that go.mod requires.
func ServerBinary(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			serverErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		mod := strings.TrimSpace(string(out))
		if mod == "" || mod == os.DevNull {
			serverErr = errors.New("go env GOMOD: not inside the module")
			return
		}
		dir, err := testenv.ProcessDir("fleet-nats-server-")
		if err != nil {
			serverErr = err
			return
		}
		bin := filepath.Join(dir, "nats-server")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
		cmd.Dir = filepath.Dir(mod)
		if out, err := cmd.CombinedOutput(); err != nil {
			serverErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
			return
		}
		serverBin = bin
	})
	if serverErr != nil {
		t.Fatal(serverErr)
	}
	return serverBin
}

// RunCluster starts n nats-server processes with JetStream, routed to each
// other as one cluster. It returns once every server accepts connections,
// not once JetStream has elected its meta leader: a test that needs that
// calls WaitReady.
func RunCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 2 {
		t.Fatalf("a cluster needs at least two servers, not %d: see RunServer", n)
	}
	return run(t, n)
}

// RunServer starts one nats-server process with JetStream and file
// storage, not clustered, as a fleet on one machine runs it: a test can
// SIGKILL it and start it again with its store (Kill, Restart).
func RunServer(t testing.TB) *Cluster {
	t.Helper()
	return run(t, 1)
}

func run(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("a cluster needs at least one server, not %d", n)
	}
	bin := ServerBinary(t)
	root := t.TempDir()
	c := &Cluster{t: t, name: "fleet-test", standalone: n == 1}
	for i := range n {
		nd := &node{name: fmt.Sprintf("n%d", i)}
		nd.dir = filepath.Join(root, nd.name)
		nd.conf = filepath.Join(nd.dir, "nats.conf")
		nd.log = filepath.Join(nd.dir, "nats.log")
		if err := os.MkdirAll(filepath.Join(nd.dir, "jetstream"), 0o755); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, nd)
	}
	t.Cleanup(c.cleanup)
	// The ports are claimed for this test binary (testport), but a
	// process that is not one may take a port before the server binds
	// it. Then all start again on new ports, since every configuration
	// names the others' route ports.
	for try := 1; ; try++ {
		c.configure(t)
		for _, nd := range c.nodes {
			c.start(nd, bin)
		}
		var err error
		for i := range c.nodes {
			if err = c.waitListening(i); err != nil {
				break
			}
		}
		if err == nil {
			return c
		}
		for i := range c.nodes {
			c.Kill(i)
		}
		if !strings.Contains(err.Error(), "address already in use") || try == 5 {
			t.Fatal(err)
		}
	}
}

// configure gives every server free ports and writes its configuration.
func (c *Cluster) configure(t testing.TB) {
	for _, nd := range c.nodes {
		nd.client, nd.route, nd.httpP = freePort(t), freePort(t), freePort(t)
	}
	for _, nd := range c.nodes {
		var routes []string
		for _, o := range c.nodes {
			if o != nd {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.route))
			}
		}
		conf := fmt.Sprintf(`server_name: %q
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
max_payload: 8MB
jetstream {
  store_dir: %q
  max_memory_store: 256MB
  max_file_store: 2GB
}
`, nd.name, nd.client, nd.httpP, filepath.Join(nd.dir, "jetstream"))
		if !c.standalone {
			conf += fmt.Sprintf(`cluster {
  name: %q
  listen: "127.0.0.1:%d"
  routes: [%s]
}
`, c.name, nd.route, strings.Join(routes, ", "))
		}
		if err := os.WriteFile(nd.conf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func (c *Cluster) start(nd *node, bin string) {
	c.t.Helper()
	logf, err := os.OpenFile(nd.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", nd.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The servers die with the test binary, even when it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.t.Fatalf("start nats-server %s: %v", nd.name, err)
	}
	var from int64
	if st, err := logf.Stat(); err == nil {
		from = st.Size()
	}
	done := make(chan struct{})
	nd.mu.Lock()
	nd.cmd, nd.done, nd.logFrom, nd.exit = cmd, done, from, nil
	nd.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		nd.mu.Lock()
		nd.exit = err
		nd.mu.Unlock()
		close(done)
	}()
}

// waitListening waits until server i accepts client connections.
func (c *Cluster) waitListening(i int) error {
	nd := c.nodes[i]
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _, err := c.get(i, "/healthz?js-server-only=true")
		if err == nil && code == http.StatusOK {
			return nil
		}
		nd.mu.Lock()
		done := nd.done
		nd.mu.Unlock()
		select {
		case <-done:
			return fmt.Errorf("nats-server %s exited while starting: %s", nd.name, nd.exited())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server %s does not accept connections after 20s (%d, %v):\n%s", nd.name, code, err, tail(nd.log, 8<<10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exited says how the server's last process ended: its exit status, the
// errors it logged, then the end of what it logged (the errors first, so
// that a report cut short still shows them).
func (nd *node) exited() string {
	nd.mu.Lock()
	from, exit := nd.logFrom, nd.exit
	nd.mu.Unlock()
	b, err := os.ReadFile(nd.log)
	if err != nil {
		return fmt.Sprintf("%v; its log: %v", exit, err)
	}
	if from > int64(len(b)) {
		from = 0
	}
	lines := strings.Split(strings.TrimRight(string(b[from:]), "\n"), "\n")
	var bad []string
	for _, l := range lines {
		if strings.Contains(l, "[ERR]") || strings.Contains(l, "[FTL]") || strings.Contains(l, "panic") {
			bad = append(bad, l)
		}
	}
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	return fmt.Sprintf("%v\nthe errors it logged:\n%s\nthe last lines it logged:\n%s",
		exit, strings.Join(bad, "\n"), strings.Join(lines, "\n"))
}

// Size is the number of servers.
func (c *Cluster) Size() int { return len(c.nodes) }

// URL is the client URL of server i.
func (c *Cluster) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].client) }

// URLs is the comma-separated list of every server's client URL, the seed
// list a client is given.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.URL(i)
	}
	return strings.Join(urls, ",")
}

// Name is the server name of server i.
func (c *Cluster) Name(i int) string { return c.nodes[i].name }

// Running reports whether server i's process is alive.
func (c *Cluster) Running(i int) bool {
	nd := c.nodes[i]
	nd.mu.Lock()
	done := nd.done
	nd.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to server i and waits for it to end: no shutdown, no
// flush, as a crash or a power loss of that node.
func (c *Cluster) Kill(i int) {
	nd := c.nodes[i]
	nd.mu.Lock()
	cmd, done := nd.cmd, nd.done
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return // not running
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	nd.mu.Lock()
	nd.kills = append(nd.kills, time.Now())
	nd.mu.Unlock()
}

// Freeze stops server i with SIGSTOP: its connections stay open but
// nothing answers, as with a node cut off by the network. Thaw resumes it.
// It returns once every thread of the server is stopped: kill(2) returns
// before they are (of 500 SIGSTOPs to a nats-server here, 227 found a
// thread still running at the first look, 377 with the cores busy, and
// the last stopped up to 14 ms later), and a thread still running could
// answer what a test sends right after.
func (c *Cluster) Freeze(i int) {
	c.t.Helper()
	c.signal(i, syscall.SIGSTOP)
	nd := c.nodes[i]
	nd.mu.Lock()
	cmd := nd.cmd
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for !stopped(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s did not stop within 5 s of SIGSTOP", c.Name(i))
		}
		time.Sleep(time.Millisecond)
	}
}

// stopped reports whether every thread of process pid is stopped (state
// T in /proc/<pid>/task/<tid>/stat).
func stopped(pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces and parentheses, the
		// state follows the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}

// Thaw resumes a frozen server with SIGCONT.
func (c *Cluster) Thaw(i int) { c.signal(i, syscall.SIGCONT) }

func (c *Cluster) signal(i int, sig syscall.Signal) {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd != nil {
		_ = nd.cmd.Process.Signal(sig)
	}
}

// Restart starts server i again (killing it first if it runs) with the same
// ports, name and store, and waits until it accepts connections.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.Kill(i)
	c.start(c.nodes[i], ServerBinary(c.t))
	if err := c.waitListening(i); err != nil {
		c.t.Fatal(err)
	}
}

// WaitReady waits until every running server reports itself healthy on
// its monitoring endpoint /healthz (JetStream enabled, in contact with and
// current with the meta leader, and every stream and consumer it holds
// current) and the servers know the meta leader. It fails the test after d.
// A stream may still be electing its leader: see WaitStreamLeader.
func (c *Cluster) WaitReady(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var bad []string
		for i, nd := range c.nodes {
			if !c.Running(i) {
				continue
			}
			code, body, err := c.get(i, "/healthz")
			if err != nil || code != http.StatusOK {
				bad = append(bad, fmt.Sprintf("%s: %d %v %s", nd.name, code, err, strings.TrimSpace(body)))
			}
		}
		if len(bad) == 0 && c.MetaLeader() >= 0 {
			return
		}
		if len(bad) == 0 {
			bad = append(bad, "no meta leader")
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not healthy after %s:\n%s", d, strings.Join(bad, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MetaLeader returns the index of the server that leads the JetStream meta
// group, as the running servers see it, or -1 when none knows of one. A
// standalone server leads everything while it runs.
func (c *Cluster) MetaLeader() int {
	if c.standalone {
		if c.Running(0) {
			return 0
		}
		return -1
	}
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		code, body, err := c.get(i, "/jsz")
		if err != nil || code != http.StatusOK {
			continue
		}
		var info server.JSInfo
		if json.Unmarshal([]byte(body), &info) != nil || info.Meta == nil || info.Meta.Leader == "" {
			continue
		}
		if l := c.index(info.Meta.Leader); l >= 0 && c.Running(l) {
			return l
		}
	}
	return -1
}

// StreamLeader returns the index of the server that leads stream's group,
// from the stream's info ($JS.API.STREAM.INFO.<stream>), or -1 when it has
// no leader or cannot be asked now.
func (c *Cluster) StreamLeader(stream string) int {
	return c.leaderFrom("$JS.API.STREAM.INFO." + stream)
}

// leaderFrom asks for a stream's or a consumer's info and returns the index
// of the leader it names.
func (c *Cluster) leaderFrom(subject string) int {
	nc, err := c.conn()
	if err != nil {
		return -1
	}
	msg, err := nc.Request(subject, nil, 2*time.Second)
	if err != nil {
		return -1
	}
	if c.standalone {
		var resp struct {
			Error *server.ApiError `json:"error"`
		}
		if json.Unmarshal(msg.Data, &resp) != nil || resp.Error != nil {
			return -1
		}
		return 0
	}
	var resp struct {
		Cluster *server.ClusterInfo `json:"cluster"`
		Error   *server.ApiError    `json:"error"`
	}
	if json.Unmarshal(msg.Data, &resp) != nil || resp.Error != nil || resp.Cluster == nil {
		return -1
	}
	return c.index(resp.Cluster.Leader)
}

// ConsumerLeader returns the index of the server that leads a stream's
// consumer, from its info ($JS.API.CONSUMER.INFO.<stream>.<consumer>), or
// -1 when it has no leader or cannot be asked now.
func (c *Cluster) ConsumerLeader(stream, consumer string) int {
	return c.leaderFrom("$JS.API.CONSUMER.INFO." + stream + "." + consumer)
}

// WaitStreamLeader waits until stream has a leader and returns its index.
func (c *Cluster) WaitStreamLeader(t testing.TB, stream string, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if l := c.StreamLeader(stream); l >= 0 {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream %s has no leader after %s", stream, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Connect returns a client connection to the whole cluster (every server's
// URL as a seed), reconnecting for ever, closed when the test ends.
func (c *Cluster) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Retry makes an idempotent JetStream request (a stream's creation, a
// publish with a message id) until it is answered, each try within 2 s,
// or ctx ends. A cluster that has just elected its meta leader, or is
// still joining its routes, may drop a request rather than answer it: a
// request given the whole of ctx would wait all of it for an answer that
// is not coming.
func Retry(ctx context.Context, try func(ctx context.Context) error) error {
	for {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := try(tctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ConnectTo returns a client connection to server i (the client may move
// to the others it learns of, should i go away), closed when the test
// ends.
func (c *Cluster) ConnectTo(t testing.TB, i int) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.URL(i), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to %s: %v", c.Name(i), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (c *Cluster) conn() (*nats.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nc != nil {
		return c.nc, nil
	}
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	c.nc = nc
	return nc, nil
}

// Index returns the index of the server named name, or -1.
func (c *Cluster) Index(name string) int { return c.index(name) }

func (c *Cluster) index(name string) int {
	for i, nd := range c.nodes {
		if nd.name == name {
			return i
		}
	}
	return -1
}

// get asks server i's monitoring endpoint.
func (c *Cluster) get(i int, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", c.nodes[i].httpP, path), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}

func (c *Cluster) cleanup() {
	c.mu.Lock()
	if c.nc != nil {
		c.nc.Close()
	}
	c.mu.Unlock()
	for i := range c.nodes {
		c.Kill(i)
	}
	if c.t.Failed() {
		for _, nd := range c.nodes {
			c.t.Logf("--- log of nats-server %s (client port %d):\n%s", nd.name, nd.client, tail(nd.log, 32<<10))
		}
	}
}

// tail returns the last n bytes of a file.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	if st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// Interval is a span of time.
type Interval struct{ From, To time.Time }

// Overlap returns how long i and [from, to] share.
func (i Interval) Overlap(from, to time.Time) time.Duration {
	a, b := i.From, i.To
	if from.After(a) {
		a = from
	}
	if to.Before(b) {
		b = to
	}
	if b.After(a) {
		return b.Sub(a)
	}
	return 0
}

// Leaderless returns the spans, between from and to, in which group (a
// stream's name, or "stream > consumer") had no leader, from what the
// servers logged when they became its leader and from when the test
// killed them: a group is leaderless from the kill of its leader until a
// server logs that it leads it.
func (c *Cluster) Leaderless(group string, from, to time.Time) []Interval {
	type event struct {
		at     time.Time
		node   int
		killed bool
	}
	var evs []event
	needle := []byte("new stream leader for '$G > " + group + "'")
	if strings.Contains(group, " > ") {
		needle = []byte("new consumer leader for '$G > " + group + "'")
	}
	for i, nd := range c.nodes {
		nd.mu.Lock()
		for _, k := range nd.kills {
			evs = append(evs, event{at: k, node: i, killed: true})
		}
		nd.mu.Unlock()
		data, err := os.ReadFile(nd.log)
		if err != nil {
			continue
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			if !bytes.Contains(line, needle) {
				continue
			}
			if at, ok := logTime(line); ok {
				evs = append(evs, event{at: at, node: i})
			}
		}
	}
	sort.Slice(evs, func(a, b int) bool { return evs[a].at.Before(evs[b].at) })
	var out []Interval
	leader := -1
	var since time.Time // leaderless since, when leader < 0
	for _, e := range evs {
		switch {
		case e.killed && e.node == leader:
			leader, since = -1, e.at
		case !e.killed:
			if leader < 0 && !since.IsZero() {
				out = append(out, Interval{since, e.at})
			}
			leader = e.node
		}
	}
	if leader < 0 && !since.IsZero() {
		out = append(out, Interval{since, time.Now()})
	}
	var in []Interval
	for _, i := range out {
		if i.To.After(from) && i.From.Before(to) {
			in = append(in, i)
		}
	}
	return in
}

// logTime reads the time of a line of a server's log,
// "[pid] 2006/01/02 15:04:05.000000 [INF] …".
func logTime(line []byte) (time.Time, bool) {
	_, rest, ok := bytes.Cut(line, []byte("] "))
	if !ok || len(rest) < 26 {
		return time.Time{}, false
	}
	at, err := time.ParseInLocation("2006/01/02 15:04:05.000000", string(rest[:26]), time.Local)
	return at, err == nil
}
