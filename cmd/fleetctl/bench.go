package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

func init() {
	var o benchOpts
	commands = append(commands, &command{
		name: "bench", args: "[--jobs N] [--rate R]",
		help: "Push jobs through the whole fleet and measure it: submit on the subject ->\n" +
			"dispatcher -> JetStream -> worker -> result. Prints jobs/s, submit-to-start and\n" +
			"submit-to-result latencies, and the CPU time of the given processes per job.",
		example: "fleetctl bench --jobs 1000\n" +
			"fleetctl bench --jobs 20000 --rate 2000 --tenants 4 -o json",
		flags: func(fs *flag.FlagSet) {
			fs.IntVar(&o.jobs, "jobs", 10000, "jobs to submit")
			fs.IntVar(&o.rate, "rate", 0, "jobs per second to offer (0: as fast as possible)")
			fs.StringVar(&o.pool, "pool", "default", "pool of the jobs")
			fs.StringVar(&o.command, "command", "true", "the jobs' command (ignored by a noop worker)")
			fs.StringVar(&o.image, "image", "", "the jobs' image, for docker and kubernetes workers (pull policy never)")
			fs.StringVar(&o.pids, "pids", "", "comma-separated pids whose CPU time is reported per job")
			fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up waiting for results after this long")
			fs.IntVar(&o.window, "window", 20000, "most jobs in flight at once")
			fs.IntVar(&o.tenants, "tenants", 1, "spread the jobs over this many tenants, bench-t0, bench-t1, … in turn (1: the client's own; an open fleet)")
			fs.StringVar(&o.metrics, "metrics", "", "a worker's /metrics URL: report its Redis round trips per job")
			fs.BoolVar(&o.stored, "stored", false, "publish on the intake subject, kept by its stream (fire and forget), instead of requests on the submit subject")
		},
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			return bench(ctx, e, o)
		},
	})
}

type benchOpts struct {
	jobs, rate, window int
	tenants            int
	stored             bool
	pool, command      string
	image              string
	pids               string
	metrics            string
	timeout            time.Duration
}

type benchReport struct {
	Jobs          int     `json:"jobs"`
	Rate          int     `json:"offered_rate,omitempty"`
	Seconds       float64 `json:"seconds"`
	JobsPerSecond float64 `json:"jobs_per_second"`
	Failed        int     `json:"failed"`
	Missing       int     `json:"missing"`
	Refused       int     `json:"refused,omitempty"`
	StartP50Ms    float64 `json:"submit_to_start_p50_ms"`
	StartP99Ms    float64 `json:"submit_to_start_p99_ms"`
	ResultP50Ms   float64 `json:"submit_to_result_p50_ms"`
	ResultP99Ms   float64 `json:"submit_to_result_p99_ms"`
	CPUPerJobUs   float64 `json:"cpu_per_job_us,omitempty"`
	// SelfCPUPerJobUs is fleetctl bench's own: the producer's and the
	// reader's work.
	SelfCPUPerJobUs float64 `json:"self_cpu_per_job_us,omitempty"`
	// RedisCallsPerJob is measured with --metrics.
	RedisCallsPerJob float64 `json:"redis_calls_per_job,omitempty"`
}

func bench(ctx context.Context, e *env, o benchOpts) error {
	if _, err := e.client(ctx); err != nil {
		return err
	}
	nc := e.nc
	names := queue.Names{Prefix: e.prefix}
	run := job.NewID()[10:18]
	n := o.jobs
	sent := make([]time.Time, n)
	started := make([]time.Duration, n)
	finished := make([]time.Duration, n)
	var mu sync.Mutex
	var done, failed int
	allDone := make(chan struct{})
	inflight := make(chan struct{}, o.window)

	// A final record is republished on <prefix>.t.<tenant>.job.<pool>.r.<id>.
	index := func(subject string) int {
		i := strings.Index(subject, ".r.bench-"+run+"-")
		if i < 0 {
			return -1
		}
		rest := subject[i+len(".r.bench-"+run+"-"):]
		ok := true
		if !ok {
			return -1
		}
		i, err := strconv.Atoi(rest)
		if err != nil || i < 0 || i >= n {
			return -1
		}
		return i
	}
	// A core subscription sees each job's final record, with its result,
	// as JetStream stores it. The start of the job comes from the result's
	// started_at (the same machine's clock), so the bench need not also
	// take every other record.
	resTenant := e.tenant
	if o.tenants > 1 {
		resTenant = "*"
	}
	resSub, err := nc.Subscribe(names.JobLive(resTenant, "*", queue.KindResult, ">"), func(m *nats.Msg) {
		at := time.Now()
		i := index(m.Subject)
		if i < 0 {
			return
		}
		status, startedAt := resultOf(m.Data)
		mu.Lock()
		if finished[i] == 0 {
			finished[i] = at.Sub(sent[i])
			if !startedAt.IsZero() {
				started[i] = max(startedAt.Sub(sent[i]), time.Nanosecond)
			}
			done++
			if status != job.StatusSucceeded {
				failed++
			}
			<-inflight
			if done == n {
				close(allDone)
			}
		}
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	defer resSub.Unsubscribe()
	_ = resSub.SetPendingLimits(-1, -1)
	// Direct submissions are requests: one inbox for all their answers, so
	// that a rejection or a fleet that does not answer is seen.
	inbox := nc.NewRespInbox()
	var refused int
	bodies := make([][]byte, n)
	subjects := []string{names.SubmitV2(e.tenant)}
	if o.stored {
		subjects = []string{names.Intake(e.tenant)}
	}
	if o.tenants > 1 {
		subjects = subjects[:0]
		for t := range o.tenants {
			if o.stored {
				subjects = append(subjects, names.Intake(fmt.Sprintf("bench-t%d", t)))
			} else {
				subjects = append(subjects, names.SubmitV2(fmt.Sprintf("bench-t%d", t)))
			}
		}
	}
	subject := subjects[0]
	ansSub, err := nc.Subscribe(inbox+".>", func(m *nats.Msg) {
		if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
			// Busy, or no dispatcher answering: send it again, as a
			// producer does (its id makes it run once).
			i, err := strconv.Atoi(m.Subject[len(inbox)+1:])
			if err == nil && i >= 0 && i < n {
				mu.Lock()
				body := bodies[i]
				mu.Unlock()
				time.AfterFunc(10*time.Millisecond, func() { _ = nc.PublishRequest(subjects[i%len(subjects)], m.Subject, body) })
			}
			return
		}
		var a job.SubmitReply
		if json.Unmarshal(m.Data, &a) != nil || a.Rejected() {
			mu.Lock()
			refused++
			mu.Unlock()
		}
	})
	if err != nil {
		return err
	}
	defer ansSub.Unsubscribe()
	_ = ansSub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		return err
	}

	cpu0, err := cpuTime(o.pids)
	if err != nil {
		return err
	}
	calls0 := redisCalls(ctx, o.metrics)
	self0 := selfCPU()
	req := job.Request{Pool: o.pool, Command: strings.Fields(o.command)}
	if o.image != "" {
		req.Image, req.PullPolicy = o.image, job.PullNever
	}
	fmt.Fprintf(e.stderr, "bench: %d jobs on pool %s, submitted on %s", n, o.pool, subject)
	if len(subjects) > 1 {
		fmt.Fprintf(e.stderr, " and %d other tenants'", len(subjects)-1)
	}
	if o.rate > 0 {
		fmt.Fprintf(e.stderr, " at %d/s", o.rate)
	}
	fmt.Fprintln(e.stderr)

	begin := time.Now()
	for i := 0; i < n; i++ {
		if o.rate > 0 {
			if d := time.Until(begin.Add(time.Duration(i) * time.Second / time.Duration(o.rate))); d > 0 {
				time.Sleep(d)
			}
		}
		select {
		case inflight <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		req.ID = fmt.Sprintf("bench-%s-%d", run, i)
		data, _ := json.Marshal(&req)
		mu.Lock()
		bodies[i], sent[i] = data, time.Now()
		mu.Unlock()
		var err error
		if subj := subjects[i%len(subjects)]; o.stored {
			err = nc.Publish(subj, data)
		} else {
			err = nc.PublishRequest(subj, inbox+"."+strconv.Itoa(i), data)
		}
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	_ = nc.Flush()

	select {
	case <-allDone:
	case <-time.After(o.timeout):
	case <-ctx.Done():
	}
	elapsed := time.Since(begin)
	cpu1, _ := cpuTime(o.pids)
	self := selfCPU() - self0
	calls1 := redisCalls(ctx, o.metrics)

	mu.Lock()
	defer mu.Unlock()
	r := benchReport{Jobs: n, Rate: o.rate, Seconds: elapsed.Seconds(), Failed: failed, Missing: n - done,
		Refused: refused, JobsPerSecond: float64(done) / elapsed.Seconds()}
	r.StartP50Ms, r.StartP99Ms = percentiles(started)
	r.ResultP50Ms, r.ResultP99Ms = percentiles(finished)
	if o.pids != "" && done > 0 {
		r.CPUPerJobUs = float64((cpu1 - cpu0).Microseconds()) / float64(done)
	}
	if done > 0 {
		r.SelfCPUPerJobUs = float64(self.Microseconds()) / float64(done)
	}
	if o.metrics != "" && done > 0 {
		r.RedisCallsPerJob = (calls1 - calls0) / float64(done)
	}
	if e.json() {
		return writeJSON(e.stdout, r)
	}
	fmt.Fprintf(e.stdout, "jobs:              %d finished (%d failed, %d missing, %d refused) in %.2fs\n", done, failed, r.Missing, refused, r.Seconds)
	fmt.Fprintf(e.stdout, "throughput:        %.0f jobs/s\n", r.JobsPerSecond)
	fmt.Fprintf(e.stdout, "submit -> start:   p50 %.2f ms   p99 %.2f ms\n", r.StartP50Ms, r.StartP99Ms)
	fmt.Fprintf(e.stdout, "submit -> result:  p50 %.2f ms   p99 %.2f ms\n", r.ResultP50Ms, r.ResultP99Ms)
	if r.CPUPerJobUs > 0 {
		fmt.Fprintf(e.stdout, "fleet CPU per job: %.0f µs (pids %s)\n", r.CPUPerJobUs, o.pids)
	}
	if o.metrics != "" {
		fmt.Fprintf(e.stdout, "Redis round trips: %.3f per job (leases in batches, and heartbeats)\n", r.RedisCallsPerJob)
	}
	if r.Missing > 0 {
		return exit(exitJobFail, "%d jobs did not finish within %s", r.Missing, o.timeout)
	}
	return nil
}

// resultOf reads what the bench needs of a final version: its result's
// status and start. It looks for the two keys in the result rather than
// decode the whole record, as a reader that needs two fields would (a
// bench's reader should cost about what the loop's does); a record it
// cannot read that way is decoded whole.
func resultOf(data []byte) (job.Status, time.Time) {
	if i := bytes.LastIndex(data, []byte(`"result":{`)); i >= 0 {
		res := data[i:]
		status, ok1 := stringAt(res, `"status":"`)
		start, ok2 := stringAt(res, `"started_at":"`)
		if t, err := time.Parse(time.RFC3339Nano, start); ok1 && ok2 && err == nil {
			return job.Status(status), t
		}
	}
	var rec struct {
		Result struct {
			Status    job.Status `json:"status"`
			StartedAt *time.Time `json:"started_at"`
		} `json:"result"`
	}
	_ = json.Unmarshal(data, &rec)
	if rec.Result.StartedAt == nil {
		return rec.Result.Status, time.Time{}
	}
	return rec.Result.Status, *rec.Result.StartedAt
}

// stringAt returns the JSON string after key in data (no escapes).
func stringAt(data []byte, key string) (string, bool) {
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return "", false
	}
	v := data[i+len(key):]
	j := bytes.IndexByte(v, '"')
	if j < 0 || bytes.IndexByte(v[:j], '\\') >= 0 {
		return "", false
	}
	return string(v[:j]), true
}

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

// cpuTime sums the user and system CPU time of the given processes and
// their waited-for children, from /proc.
func cpuTime(pids string) (time.Duration, error) {
	var total time.Duration
	if pids == "" {
		return 0, nil
	}
	for _, p := range strings.Split(pids, ",") {
		data, err := os.ReadFile("/proc/" + strings.TrimSpace(p) + "/stat")
		if err != nil {
			return 0, fmt.Errorf("--pids: %w", err)
		}
		// Fields after the command name, which may hold spaces.
		s := string(data)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// utime, stime, cutime, cstime are fields 14-17 of stat (1-based).
		for _, f := range fields[11:15] {
			ticks, _ := strconv.ParseInt(f, 10, 64)
			total += time.Duration(ticks) * time.Second / 100 // USER_HZ
		}
	}
	return total, nil
}

// redisCalls reads a worker's count of Redis round trips from its metrics.
func redisCalls(ctx context.Context, url string) float64 {
	if url == "" {
		return 0
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var total float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "fleet_capacity_redis_calls_total") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
}
