package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// BenchmarkFind measures what finding a job costs on a real server, with
// pools pools of which one holds the job (queued, running, finished; its
// request carrying 16 KiB of inputs), against the ways it could be done:
//
//	find           Find: one batched direct get per pool (multi_last)
//	by-body        what Find did before: one direct get of the last
//	               version per pool, the latest submitted by its body wins
//	first+latest   one direct get of each pool's first version
//	               (next_by_subj from 0), then the last version of the pool
//	               that has the job
//	q1-q5+latest   five direct gets per pool, one per queued subject, then
//	               the last version of the pool that has the job
//
// Each runs on loopback (net=loopback), and again through a proxy that
// holds every byte for at least 250 µs each way (net=delayed: a round trip
// of about 2 ms on a loaded machine, where a sleep lasts longer than
// asked), as between machines.
//
// go test -run '^$' -bench BenchmarkFind -benchtime 2000x ./internal/queue/
func BenchmarkFind(b *testing.B) {
	for _, setup := range []struct {
		pools int
		delay time.Duration
	}{{2, 0}, {8, 0}, {2, 250 * time.Microsecond}, {8, 250 * time.Microsecond}} {
		pools := setup.pools
		s := natstest.Run(b)
		url, network := s.URL(), "loopback"
		if setup.delay > 0 {
			network = "delayed"
			url = delayed(b, strings.TrimPrefix(url, "nats://"), setup.delay)
		}
		nc, err := nats.Connect(url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		c := Config{}.WithDefaults()
		var names []string
		for i := range pools {
			p := fmt.Sprintf("p%d", i)
			names = append(names, p)
			if _, err := EnsurePoolStream(ctx, js, c, p, slog.Default()); err != nil {
				b.Fatal(err)
			}
		}
		j := NewJobs(js, c.Names)
		k := JobKey{Tenant: "acme", Pool: names[pools-1], ID: "j1"}
		now := time.Now()
		rec := &job.Record{ID: k.ID, Tenant: k.Tenant, Pool: k.Pool, Priority: 3, State: job.StateQueued, Event: job.EventQueued,
			SubmittedAt: now, UpdatedAt: now, Request: &job.Request{Command: []string{"true"},
				Inputs: map[string]string{"in.txt": strings.Repeat("x", 16<<10)}}}
		rev, err := j.Queue(ctx, rec, 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, st := range []job.State{job.StateRunning, job.StateSucceeded} {
			r := rec.Version()
			r.State = st
			if st.Final() {
				r.Result = &job.Result{JobID: k.ID, Pool: k.Pool, Status: job.StatusSucceeded}
			}
			if rev, err = j.Write(ctx, r, rev); err != nil {
				b.Fatal(err)
			}
		}
		for _, v := range []struct {
			name string
			find func() (*job.Record, uint64, error)
		}{
			{"find", func() (*job.Record, uint64, error) { return j.Find(ctx, k.Tenant, k.ID, names) }},
			{"by-body", func() (*job.Record, uint64, error) { return j.findByBody(ctx, k.Tenant, k.ID, names) }},
			{"first+latest", func() (*job.Record, uint64, error) { return j.findByProbe(ctx, k.Tenant, k.ID, names, j.firstIsQueued) }},
			{"q1-q5+latest", func() (*job.Record, uint64, error) { return j.findByProbe(ctx, k.Tenant, k.ID, names, j.hasQueued) }},
		} {
			b.Run(fmt.Sprintf("pools=%d/net=%s/%s", pools, network, v.name), func(b *testing.B) {
				for b.Loop() {
					got, seq, err := v.find()
					if err != nil || got.State != job.StateSucceeded || seq != rev {
						b.Fatalf("%+v at %d, %v", got, seq, err)
					}
				}
			})
		}
	}
}

// findByBody is Find as it was: the last version in each pool, the latest
// submitted by its body wins.
func (j *Jobs) findByBody(ctx context.Context, tenant, id string, pools []string) (*job.Record, uint64, error) {
	type found struct {
		rec *job.Record
		rev uint64
		err error
	}
	ch := make(chan found, len(pools))
	for _, p := range pools {
		go func() {
			m, err := directLast(ctx, j.nc, j.names.PoolStreamV2(p), j.names.PoolJobAll(p, tenant, id))
			if err != nil || m == nil {
				ch <- found{err: cmpErr(err, ErrNotFound)}
				return
			}
			var rec job.Record
			err = json.Unmarshal(m.Data, &rec)
			ch <- found{&rec, storedOf(j.names, m).seq, err}
		}()
	}
	var best found
	for range pools {
		f := <-ch
		if f.err == nil && (best.rec == nil || f.rec.SubmittedAt.After(best.rec.SubmittedAt)) {
			best = f
		}
	}
	if best.rec == nil {
		return nil, 0, ErrNotFound
	}
	return best.rec, best.rev, nil
}

// findByProbe asks each pool at once whether it queued the job (queued),
// then reads the last version of the first that did.
func (j *Jobs) findByProbe(ctx context.Context, tenant, id string, pools []string,
	queued func(ctx context.Context, k JobKey) (bool, error)) (*job.Record, uint64, error) {
	ch := make(chan JobKey, len(pools))
	for _, p := range pools {
		go func() {
			k := JobKey{Tenant: tenant, Pool: p, ID: id}
			if ok, err := queued(ctx, k); err != nil || !ok {
				k = JobKey{}
			}
			ch <- k
		}()
	}
	var at JobKey
	for range pools {
		if k := <-ch; k.Pool != "" {
			at = k
		}
	}
	if at.Pool == "" {
		return nil, 0, ErrNotFound
	}
	return j.Latest(ctx, at)
}

// firstIsQueued reads the first version of a job in its pool.
func (j *Jobs) firstIsQueued(ctx context.Context, k JobKey) (bool, error) {
	req, _ := json.Marshal(map[string]any{"seq": 0, "next_by_subj": j.names.PoolJobAll(k.Pool, k.Tenant, k.ID)})
	m, err := j.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+j.names.PoolStreamV2(k.Pool), req)
	if err != nil {
		return false, err
	}
	if m.Header.Get("Status") != "" {
		return false, nil
	}
	return isQueuedKind(storedOf(j.names, m).kind), nil
}

// hasQueued reads the last message of each of a job's five queued
// subjects.
func (j *Jobs) hasQueued(ctx context.Context, k JobKey) (bool, error) {
	ch := make(chan error, 5)
	for p := 1; p <= 5; p++ {
		go func() {
			m, err := directLast(ctx, j.nc, j.names.PoolStreamV2(k.Pool), j.names.PoolJob(k.Pool, KindQueued(p), k.Tenant, k.ID))
			if err == nil && m == nil {
				err = ErrNotFound
			}
			ch <- err
		}()
	}
	found := false
	var firstErr error
	for range 5 {
		switch err := <-ch; {
		case err == nil:
			found = true
		case !errors.Is(err, ErrNotFound):
			firstErr = cmpErr(firstErr, err)
		}
	}
	return found, firstErr
}

// delayed starts a proxy to addr that holds every byte for delay in each
// direction, and returns its URL.
func delayed(b *testing.B, addr string, delay time.Duration) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	pipe := func(dst, src net.Conn) {
		type chunk struct {
			data []byte
			at   time.Time
		}
		ch := make(chan chunk, 1024)
		go func() {
			defer dst.Close()
			for c := range ch {
				time.Sleep(time.Until(c.at))
				if _, err := dst.Write(c.data); err != nil {
					return
				}
			}
		}()
		defer close(ch)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(delay)}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return "nats://" + l.Addr().String()
}
