// Command jsloop-bench is the lower bound the fleet's benchmark is compared
// with: the bare JetStream loop on the same machine, the least a
// queue-driven fleet must do per job, with no fleet code. It is a module of
// its own, like bench/asynq, so that the fleet does not depend on it.
//
//	jsloop-bench --nats nats://127.0.0.1:4222 --redis redis://127.0.0.1:6379/0 --jobs 5000 --workers 64
//	jsloop-bench ... --jobs 5000 --rate 1000   # paced: publish -> result latency
//
// Per job:
//
//  1. the producer publishes the job (~300 bytes of JSON, a no-op request)
//     to a work-queue stream, asynchronously, with a message id;
//  2. the consumer pulls it in a batch of up to 64 and decodes it;
//  3. reserves a slot lease with a Redis Lua script: a hash per worker
//     holding its slot count, a counter of the slots used and one field
//     per lease, refusing past the slot count;
//  4. runs a no-op;
//  5. publishes the result to a limits stream, asynchronously;
//  6. releases the lease (Redis) and its slot;
//  7. once JetStream has stored the result, acks the job;
//  8. a reader counts the result on a core subscription.
//
// That is two writes to JetStream a job beside its publication (the result,
// and the ack that removes it from the work queue) and two lease operations
// in Redis. As the fleet's worker does (internal/capacity/ledger), the
// lease operations are queued and sent by one goroutine, every queued
// operation in one script call, so that under load many jobs share a round
// trip; a reservation waits for its answer, a release does not.
//
// The pull is the fleet's too: Fetch, asking for as many messages as there
// are free slots (at most 64), with at most two pull requests open. Fetch
// and not Consume, because Consume keeps a buffer of messages filled
// whether or not a slot is free: the consumer would hold jobs it cannot
// start, which a fleet must not do (another worker could run them), and
// the figure would then measure a protocol the fleet cannot use. (Consume
// with a buffer of 64 was no faster on the 2-core machine this was
// written on: about 15,000 jobs/s both ways.)
//
// The jobs stream is a work queue (file storage, like the fleet's, unless
// --storage memory) and the results stream a limits stream, both deleted
// and made again at every run (JSLOOP_JOBS, JSLOOP_RESULTS).
//
// It prints one line of JSON: jobs, seconds, jobs_per_second, cpu_seconds
// (this process's, from getrusage: the producer, the consumer and the
// reader), cpu_per_job_us (this process's and that of the processes given
// with --pids: nats-server, redis-server), self_cpu_per_job_us (this
// process's alone), redis_calls_per_job and pull_requests_per_job (how
// well the batches fill), refused (reservations Redis refused), job_bytes,
// and, checked after the clock stops, jobs_left in the work queue (0: all
// acked) and results_stored. The clock runs from the first publication to
// the last result, as fleetctl bench's does. With --rate, the producer
// publishes that many jobs a second, and publish_to_result_p50_ms and
// _p99_ms say how long each job took from its publication to its result
// heard by the reader (fleetctl bench's submit -> result, paced the same).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

const (
	jobsStream     = "JSLOOP_JOBS"
	resultsStream  = "JSLOOP_RESULTS"
	jobsSubject    = "JSLOOP.jobs"
	resultsPrefix  = "JSLOOP.results."
	consumerName   = "JSLOOP_WORKERS"
	workerID       = "jsloop"
	slotsKey       = "jsloop:{w:" + workerID + "}:slots"
	leaseTTL       = 15 * time.Second // the fleet's: five heartbeat intervals of 3 s
	fetchWait      = time.Second      // the fleet's DefaultFetchWait
	publishPending = 4096             // the fleet worker's WithPublishAsyncMaxPending
)

type options struct {
	nats, redis, storage, pids string
	jobs, workers, batch, rate int
	timeout                    time.Duration
	keep                       bool
}

func main() {
	var o options
	flag.StringVar(&o.nats, "nats", nats.DefaultURL, "NATS server URL")
	flag.StringVar(&o.redis, "redis", "redis://127.0.0.1:6379/0", "Redis URL")
	flag.IntVar(&o.jobs, "jobs", 5000, "jobs to publish and process")
	flag.IntVar(&o.workers, "workers", 64, "jobs processed at once (the fleet's slots)")
	flag.IntVar(&o.batch, "batch", 64, "most messages one pull request asks for")
	flag.IntVar(&o.rate, "rate", 0, "jobs published per second (0: as fast as possible)")
	flag.StringVar(&o.storage, "storage", "file", "storage of the jobs stream: file or memory")
	flag.StringVar(&o.pids, "pids", "", "comma-separated pids whose CPU time is counted too (nats-server, redis-server)")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up waiting for results after this long")
	flag.BoolVar(&o.keep, "keep", false, "keep the streams and the slots hash after the run (deleted by default)")
	flag.Parse()
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

func run(o options) error {
	if o.jobs <= 0 || o.workers <= 0 || o.batch <= 0 {
		return errors.New("--jobs, --workers and --batch must be positive")
	}
	storage := jetstream.FileStorage
	switch o.storage {
	case "file":
	case "memory":
		storage = jetstream.MemoryStorage
	default:
		return fmt.Errorf("--storage %q: file or memory", o.storage)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Two connections, as the fleet's benchmark has: the client's (the
	// producer and the reader, fleetctl bench's) and the worker's.
	client, err := nats.Connect(o.nats, nats.Name("jsloop-client"))
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer client.Close()
	wconn, err := nats.Connect(o.nats, nats.Name("jsloop-worker"))
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer wconn.Close()
	cjs, err := jetstream.New(client, jetstream.WithPublishAsyncMaxPending(publishPending))
	if err != nil {
		return err
	}
	wjs, err := jetstream.New(wconn, jetstream.WithPublishAsyncMaxPending(publishPending))
	if err != nil {
		return err
	}

	ropt, err := redis.ParseURL(o.redis)
	if err != nil {
		return fmt.Errorf("--redis: %w", err)
	}
	rdb := redis.NewClient(ropt)
	defer rdb.Close()

	cons, err := setup(ctx, wjs, rdb, storage, o.workers)
	if err != nil {
		return err
	}

	// The reader: a core subscription on the results, as fleetctl bench's.
	// A job is counted once, should it be delivered again.
	seen := make([]bool, o.jobs)
	// sent and took are each job's publication (unix ns) and its time to
	// its result.
	sent := make([]atomic.Int64, o.jobs)
	took := make([]time.Duration, o.jobs)
	var got int
	var mu sync.Mutex
	allDone := make(chan struct{})
	sub, err := client.Subscribe(resultsPrefix+">", func(m *nats.Msg) {
		i, err := strconv.Atoi(m.Subject[len(resultsPrefix):])
		if err != nil || i < 0 || i >= len(seen) {
			return
		}
		at := time.Now().UnixNano()
		mu.Lock()
		defer mu.Unlock()
		if !seen[i] {
			seen[i] = true
			took[i] = time.Duration(at - sent[i].Load())
			if got++; got == len(seen) {
				close(allDone)
			}
		}
	})
	if err != nil {
		return err
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := client.Flush(); err != nil {
		return err
	}

	led := &ledger{rdb: rdb, wake: make(chan struct{}, 1)}
	w := &worker{js: wjs, cons: cons, led: led, slots: newSlots(o.workers), batch: o.batch,
		errs: make(chan error, 1)}
	var bg sync.WaitGroup
	bg.Go(func() { led.loop(ctx) })
	bg.Go(func() { w.pull(ctx) })
	defer bg.Wait()
	defer cancel()

	cpu0, err := cpuTime(o.pids)
	if err != nil {
		return err
	}
	self0 := selfCPU()
	start := time.Now()
	jobBytes, err := produce(ctx, cjs, o.jobs, o.rate, sent)
	if err != nil {
		return err
	}
	select {
	case <-allDone:
	case err := <-w.errs:
		return err
	case <-time.After(o.timeout):
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("only %d of %d results within %s", got, o.jobs, o.timeout)
	}
	elapsed := time.Since(start)
	self := selfCPU() - self0
	cpu1, err := cpuTime(o.pids)
	if err != nil {
		return err
	}
	left, stored, err := settled(ctx, wjs, wconn)
	if err != nil {
		return err
	}
	n := float64(o.jobs)
	mu.Lock()
	p50, p99 := percentiles(took)
	mu.Unlock()
	err = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"offered_rate":             o.rate,
		"publish_to_result_p50_ms": p50,
		"publish_to_result_p99_ms": p99,
		"jobs":                     o.jobs,
		"workers":                  o.workers,
		"seconds":                  elapsed.Seconds(),
		"jobs_per_second":          n / elapsed.Seconds(),
		"cpu_seconds":              self.Seconds(),
		"cpu_per_job_us":           float64((self + cpu1 - cpu0).Microseconds()) / n,
		"self_cpu_per_job_us":      float64(self.Microseconds()) / n,
		"redis_calls_per_job":      float64(led.calls.Load()) / n,
		"pull_requests_per_job":    float64(w.fetches.Load()) / n,
		"refused":                  w.refused.Load(),
		"job_bytes":                jobBytes,
		"jobs_left":                left,
		"results_stored":           stored,
	})
	cancel()
	bg.Wait()
	if !o.keep {
		// Leave the servers as they were found: bench.sh runs the fleet's
		// benchmarks on them next.
		teardown(context.Background(), wjs, rdb)
	}
	return err
}

// settled checks, after the run, that every job was acked (the work queue
// is empty, once the server has applied the last acks) and every result
// stored.
func settled(ctx context.Context, js jetstream.JetStream, nc *nats.Conn) (left, stored uint64, err error) {
	if err := nc.Flush(); err != nil {
		return 0, 0, err
	}
	for try := 0; ; try++ {
		s, err := js.Stream(ctx, jobsStream)
		if err != nil {
			return 0, 0, err
		}
		if left = s.CachedInfo().State.Msgs; left == 0 || try == 40 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	s, err := js.Stream(ctx, resultsStream)
	if err != nil {
		return 0, 0, err
	}
	return left, s.CachedInfo().State.Msgs, nil
}

// setup makes the streams and the consumer afresh, and writes the worker's
// slots hash as its heartbeat would.
func setup(ctx context.Context, js jetstream.JetStream, rdb *redis.Client, storage jetstream.StorageType, slots int) (jetstream.Consumer, error) {
	for _, name := range []string{jobsStream, resultsStream} {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("delete stream %s: %w", name, err)
		}
	}
	base := jetstream.StreamConfig{
		Storage: storage, Replicas: 1, Duplicates: 2 * time.Minute,
		Discard: jetstream.DiscardOld, MaxMsgs: -1, MaxBytes: -1, MaxMsgsPerSubject: -1, MaxConsumers: -1,
	}
	jobs := base
	jobs.Name, jobs.Subjects, jobs.Retention = jobsStream, []string{jobsSubject}, jetstream.WorkQueuePolicy
	results := base
	results.Name, results.Subjects, results.Retention = resultsStream, []string{resultsPrefix + ">"}, jetstream.LimitsPolicy
	for _, sc := range []jetstream.StreamConfig{jobs, results} {
		// Right after the account's last stream is deleted, the server may
		// still be removing its directory and refuse a new one: try again.
		var err error
		for try := 0; try < 20; try++ {
			if _, err = js.CreateStream(ctx, sc); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			return nil, fmt.Errorf("create stream %s: %w", sc.Name, err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, jobsStream, jetstream.ConsumerConfig{
		Durable: consumerName, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxDeliver: -1, MaxAckPending: -1, MaxWaiting: 4096,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	if err := rdb.Del(ctx, slotsKey).Err(); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if err := rdb.HSet(ctx, slotsKey, "slots", slots, "used", 0).Err(); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return cons, rdb.PExpire(ctx, slotsKey, leaseTTL).Err()
}

// teardown deletes the streams and the slots hash, once the run is over.
func teardown(ctx context.Context, js jetstream.JetStream, rdb *redis.Client) {
	for _, name := range []string{jobsStream, resultsStream} {
		if err := js.DeleteStream(ctx, name); err != nil {
			log.Printf("delete stream %s: %v", name, err)
		}
	}
	if err := rdb.Del(ctx, slotsKey).Err(); err != nil {
		log.Printf("redis: %v", err)
	}
}

// request is what the producer sends: the shape of a no-op job as the
// fleet's jobs stream holds it, about 300 bytes.
type request struct {
	ID          string            `json:"id"`
	Pool        string            `json:"pool"`
	Command     []string          `json:"command"`
	Resources   map[string]string `json:"resources"`
	Timeout     string            `json:"timeout"`
	MaxAttempts int               `json:"max_attempts"`
	Labels      map[string]string `json:"labels"`
	SubmittedAt time.Time         `json:"submitted_at"`
	Trace       string            `json:"traceparent"`
}

// result is what the worker sends back.
type result struct {
	JobID      string    `json:"job_id"`
	Status     string    `json:"status"`
	Attempt    int       `json:"attempt"`
	ExitCode   int       `json:"exit_code"`
	WorkerID   string    `json:"worker_id"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// produce publishes n jobs as fast as JetStream takes them, or rate a
// second, noting when each was sent, and waits for their
// acknowledgements. It returns the size of a job.
func produce(ctx context.Context, js jetstream.JetStream, n, rate int, sent []atomic.Int64) (size int, err error) {
	req := request{
		Pool: "default", Command: []string{"true"},
		Resources: map[string]string{"cpu": "100m", "memory": "64Mi"},
		Timeout:   "1h0m0s", MaxAttempts: 3, Labels: map[string]string{"bench": "jsloop"},
		Trace: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	begin := time.Now()
	for i := range n {
		if rate > 0 {
			if d := time.Until(begin.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
				time.Sleep(d)
			}
		}
		req.ID = fmt.Sprintf("%026d", i) // as long as the fleet's ids
		req.SubmittedAt = time.Now().UTC()
		data, err := json.Marshal(&req)
		if err != nil {
			return 0, err
		}
		size = len(data)
		m := nats.NewMsg(jobsSubject)
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, req.ID)
		sent[i].Store(time.Now().UnixNano())
		if _, err := js.PublishMsgAsync(m); err != nil {
			return 0, fmt.Errorf("publish job %d: %w", i, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return size, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("%d jobs not acknowledged by JetStream", js.PublishAsyncPending())
	}
}

// worker is the consumer: its pull loop and its slots.
type worker struct {
	js      jetstream.JetStream
	cons    jetstream.Consumer
	led     *ledger
	slots   *slots
	batch   int
	fetches atomic.Int64
	refused atomic.Int64
	errs    chan error // the first error that stops the run
}

func (w *worker) fail(err error) {
	select {
	case w.errs <- err:
	default:
	}
}

// pull asks the consumer for as many messages as there are free slots, at
// most batch, and starts each message as it arrives. As the fleet's worker
// does, at most two pull requests are open at once, and when few slots are
// free (under load they come back one at a time) it waits 200 µs to ask
// for several in one request.
func (w *worker) pull(ctx context.Context) {
	open := make(chan struct{}, 2)
	for {
		select {
		case open <- struct{}{}:
		case <-ctx.Done():
			return
		}
		n, err := w.slots.acquireAll(ctx, w.batch)
		if err != nil {
			return
		}
		if n < w.batch/4 {
			time.Sleep(200 * time.Microsecond)
			n += w.slots.tryAcquire(w.batch - n)
		}
		batch, err := w.cons.Fetch(n, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			w.slots.release(n)
			<-open
			if ctx.Err() != nil {
				return
			}
			w.fail(fmt.Errorf("fetch: %w", err))
			return
		}
		w.fetches.Add(1)
		go func() {
			used := 0
			for msg := range batch.Messages() {
				used++
				go w.handle(ctx, msg)
			}
			w.slots.release(n - used)
			<-open
		}()
	}
}

// handle runs one job: lease, no-op, result, release, ack.
func (w *worker) handle(ctx context.Context, msg jetstream.Msg) {
	var req request
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		w.slots.release(1)
		_ = msg.Term()
		return
	}
	field := "l:" + req.ID + "/1"
	switch err := w.led.reserve(ctx, field, msg.Reply()); {
	case errors.Is(err, errNoSlot):
		w.refused.Add(1)
		w.slots.release(1)
		_ = msg.NakWithDelay(100 * time.Millisecond)
		return
	case err != nil:
		w.slots.release(1)
		w.fail(err)
		return
	}
	started := time.Now().UTC()
	// The no-op.
	res := result{JobID: req.ID, Status: "succeeded", Attempt: 1, WorkerID: workerID,
		StartedAt: started, FinishedAt: time.Now().UTC()}
	data, _ := json.Marshal(&res)
	m := nats.NewMsg(resultsPrefix + req.ID)
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, req.ID+"/result")
	f, err := w.js.PublishMsgAsync(m)
	// The attempt is over: its lease and slot go back at once, as the
	// fleet's worker gives them back before it settles the job.
	w.led.release(field)
	w.slots.release(1)
	if err != nil {
		w.fail(fmt.Errorf("publish result: %w", err))
		return
	}
	// The job is acked only once its result is stored.
	select {
	case <-f.Ok():
	case err := <-f.Err():
		w.fail(fmt.Errorf("publish result: %w", err))
		return
	case <-ctx.Done():
		return
	}
	if err := msg.Ack(); err != nil {
		w.fail(fmt.Errorf("ack: %w", err))
	}
}

// percentiles are the median and the 99th percentile of ds, in
// milliseconds, computed as fleetctl bench computes them.
func percentiles(ds []time.Duration) (p50, p99 float64) {
	var v []time.Duration
	for _, d := range ds {
		if d > 0 {
			v = append(v, d)
		}
	}
	if len(v) == 0 {
		return 0, 0
	}
	slices.Sort(v)
	at := func(p float64) float64 {
		return float64(v[min(len(v)-1, int(p*float64(len(v))))].Microseconds()) / 1000
	}
	return at(0.50), at(0.99)
}

// selfCPU is the CPU time this process has used (getrusage).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuTime is the CPU time the processes pids have used, from /proc.
func cpuTime(pids string) (time.Duration, error) {
	var total time.Duration
	for _, p := range strings.Split(pids, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		data, err := os.ReadFile("/proc/" + p + "/stat")
		if err != nil {
			return 0, fmt.Errorf("cpu time of %s: %w", p, err)
		}
		// Fields after the command name, which is in parentheses.
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(utime+stime) * time.Second / 100 // clock ticks
	}
	return total, nil
}
