package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// opCounter counts, from a NATS server's trace, what its clients ask of
// it and what it delivers to them, by kind, and the bytes of each (headers
// and payload).
type opCounter struct {
	mu     sync.Mutex
	counts map[string]opStat
}

type opStat struct{ n, bytes int }

func (o *opCounter) Noticef(string, ...any) {}
func (o *opCounter) Warnf(string, ...any)   {}
func (o *opCounter) Fatalf(string, ...any)  {}
func (o *opCounter) Errorf(string, ...any)  {}
func (o *opCounter) Debugf(string, ...any)  {}

func (o *opCounter) Tracef(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	kind := opKind(line)
	if kind == "" {
		return
	}
	// The operation's last field is its size, headers and payload.
	op := strings.TrimSuffix(strings.TrimSpace(line), "]")
	size, _ := strconv.Atoi(op[strings.LastIndexByte(op, ' ')+1:])
	o.mu.Lock()
	st := o.counts[kind]
	st.n++
	st.bytes += size
	o.counts[kind] = st
	o.mu.Unlock()
}

// reset forgets what was counted so far.
func (o *opCounter) reset() map[string]opStat {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.counts
	o.counts = map[string]opStat{}
	return c
}

// opKind names the operation of a line of a server's trace, or nothing for
// a line that is not one: a client's publish ("<<- [PUB subject …]") by
// what its subject asks, and a message delivered to a client ("->> [MSG
// subject sid reply size]") by what it carries.
func opKind(line string) string {
	if strings.HasPrefix(line, "JETSTREAM ") || strings.HasPrefix(line, "ACCOUNT ") || strings.HasPrefix(line, "SYSTEM ") {
		return "" // the server's own clients
	}
	if _, rest, ok := strings.Cut(line, "<<- [PUB "); ok {
		return "in: " + inKind(rest)
	}
	if _, rest, ok := strings.Cut(line, "<<- [HPUB "); ok {
		return "in: " + inKind(rest)
	}
	if _, rest, ok := strings.Cut(line, "->> [MSG "); ok {
		return "out: " + outKind(rest)
	}
	if _, rest, ok := strings.Cut(line, "->> [HMSG "); ok {
		return "out: " + outKind(rest)
	}
	return ""
}

// inKind names a publish by its subject.
func inKind(rest string) string {
	subject, _, _ := strings.Cut(rest, " ")
	tok := strings.Split(subject, ".")
	switch {
	case strings.HasPrefix(subject, "$JS.API.CONSUMER.MSG.NEXT."):
		return "pull request"
	case strings.HasPrefix(subject, "$JS.ACK."):
		return "ack"
	case strings.HasPrefix(subject, "$JS.API.DIRECT.GET.") || strings.HasPrefix(subject, "$JS.API.STREAM.MSG.GET."):
		return "stream read"
	case strings.HasPrefix(subject, "$JS.API.") && len(tok) >= 4:
		return "JetStream API " + tok[2] + "." + tok[3]
	case strings.HasPrefix(subject, "_INBOX."):
		return "reply"
	case len(tok) >= 4 && tok[0] == "fleet" && tok[1] == "p":
		return "stream write, kind " + tok[3][:1]
	}
	return fleetSubject(tok)
}

// fleetSubject names a subject of the fleet's other than a stream's: a
// tenant's (fleet.t.<tenant>.<what>…) by what, another by its second token.
func fleetSubject(tok []string) string {
	switch {
	case len(tok) >= 4 && tok[0] == "fleet" && tok[1] == "t":
		return "tenant subject ." + tok[3]
	case len(tok) >= 2 && tok[0] == "fleet":
		return "fleet subject ." + tok[1]
	}
	return "other"
}

// outKind names a delivery by its subject and reply: MSG subject sid
// [reply] size, HMSG subject sid [reply] header-size size.
func outKind(rest string) string {
	f := strings.Fields(strings.TrimSuffix(rest, "]"))
	subject, reply := f[0], ""
	if len(f) >= 4 && !isNumber(f[2]) {
		reply = f[2]
	}
	tok := strings.Split(subject, ".")
	switch {
	case strings.HasPrefix(reply, "$JS.ACK."):
		return "message pulled"
	case strings.HasPrefix(subject, "_INBOX."):
		return "reply"
	}
	return fleetSubject(tok)
}

func isNumber(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// BenchmarkServerOperationsPerJob counts what a no-op job asks of the NATS
// server, by kind: its producer's request and the answer, the dispatcher's
// and the worker's reads, writes, pulls and acks, and the copies of its
// versions delivered live to one listener of how jobs end. One worker
// with 64 slots and the worker command's --running-after, b.N jobs requested on fleet.t.default.submit, 64 at a
// time. make bench prints it; what a job costs the server is where the
// write path's work is (issue: ask the server less).
func BenchmarkServerOperationsPerJob(b *testing.B) {
	ops := &opCounter{counts: map[string]opStat{}}
	f := fleettest.StartOn(b, natstest.Traced(b, ops))
	f.Worker(b, noop.Executor{}, worker.Config{ID: "w-ops", Slots: 64, RunningAfter: worker.DefaultRunningAfter})
	producer, err := client.New(f.NATS.Connect(b))
	if err != nil {
		b.Fatal(err)
	}
	ended := make(chan string, 1024)
	listen := f.NATS.Connect(b)
	if _, err := listen.Subscribe("fleet.t.default.job.*.r.>", func(m *nats.Msg) {
		ended <- m.Subject
	}); err != nil {
		b.Fatal(err)
	}
	if err := listen.Flush(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// One job first, so that the pool's stream and queues exist.
	if _, err := producer.Submit(ctx, &job.Request{ID: "ops-first", Command: []string{"true"}}); err != nil {
		b.Fatal(err)
	}
	<-ended
	time.Sleep(500 * time.Millisecond) // what the first job set off: not the jobs'
	ops.reset()

	b.ResetTimer()
	sem := make(chan struct{}, 64)
	errs := make(chan error, 1)
	go func() {
		for i := range b.N {
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				if _, err := producer.Submit(ctx, &job.Request{ID: fmt.Sprintf("ops-%d-%d", b.N, i), Command: []string{"true"}}); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}()
		}
	}()
	for range b.N {
		select {
		case <-ended:
		case err := <-errs:
			b.Fatal(err)
		case <-ctx.Done():
			b.Fatal("the jobs did not end")
		}
	}
	b.StopTimer()
	counts := ops.reset()
	var total, in, bytes int
	var table strings.Builder
	n := float64(b.N)
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		st := counts[k]
		total += st.n
		bytes += st.bytes
		if strings.HasPrefix(k, "in: ") {
			in += st.n
		}
		if st.n > 0 {
			fmt.Fprintf(&table, "\n%6.2f  %6.0f B  %s", float64(st.n)/n, float64(st.bytes)/float64(st.n), k)
		}
	}
	b.Logf("server operations per job, of %d jobs (each kind's count a job, and its mean size):%s\n%6.2f  %6.0f B  in all a job (%.2f asked of it, %.2f delivered by it)",
		b.N, table.String(), float64(total)/n, float64(bytes)/n, float64(in)/n, float64(total-in)/n)
	b.ReportMetric(float64(bytes)/n, "B/job")
	b.ReportMetric(float64(in)/float64(b.N), "asked/job")
	b.ReportMetric(float64(total-in)/float64(b.N), "delivered/job")
}
