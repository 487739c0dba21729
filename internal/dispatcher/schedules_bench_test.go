package dispatcher_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// BenchmarkSchedules is the figure: 1,000 schedules firing every
// second on one pool, for a minute, fired by a dispatcher process (its
// CPU read from /proc) with a no-op worker process, on an in-process NATS
// server. It reports how late the firings were (from the firing's time to
// its job's submitted_at, read back from the pool's stream, and the share
// queued within 100 ms by the dispatcher's own lateness histogram), the
// firings made against the slots of the run, and the dispatcher's CPU.
//
// It runs once whatever b.N. FLEET_BENCH_SCHEDULES_FOR shortens the run
// (10s, say), FLEET_BENCH_SCHEDULES changes the number of schedules, and
// FLEET_BENCH_SCHEDULES_OVERLAP their overlap policy (skip, the default,
// reads the previous firing's job at each firing; allow does not), and
// FLEET_BENCH_SCHEDULES_PROFILE=file writes a CPU profile of the
// dispatcher over the run.
func BenchmarkSchedules(b *testing.B) {
	run, n := time.Minute, 1000
	if s := os.Getenv("FLEET_BENCH_SCHEDULES_FOR"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 3*time.Second {
			b.Fatalf("FLEET_BENCH_SCHEDULES_FOR=%q: a duration of at least 3s", s)
		}
		run = d
	}
	if s := os.Getenv("FLEET_BENCH_SCHEDULES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("FLEET_BENCH_SCHEDULES=%q: a number of schedules", s)
		}
		n = v
	}
	overlap := job.Overlap(os.Getenv("FLEET_BENCH_SCHEDULES_OVERLAP"))
	if overlap != "" && !overlap.Valid() {
		b.Fatalf("FLEET_BENCH_SCHEDULES_OVERLAP=%q: skip, allow or cancel_previous", overlap)
	}
	fleettest.Binary(b, "dispatcher") // built before anything starts
	srv := natstest.Run(b)
	addr := freeAddr(b)
	env := []string{"FLEET_NATS_URL=" + srv.URL(), "FLEET_REDIS_URL=", "FLEET_DATA_DIR=" + b.TempDir(), "FLEET_HTTP_ADDR=" + addr}
	profile := os.Getenv("FLEET_BENCH_SCHEDULES_PROFILE")
	if profile != "" {
		env = append(env, "FLEET_PPROF=true")
	}
	d := fleettest.StartProc(b, "dispatcher", env)
	d.WaitOutput(b, "dispatcher ready", 30*time.Second)
	d.WaitOutput(b, "this dispatcher holds their lease", 15*time.Second)
	w := fleettest.StartProc(b, "worker", env, "--id", "bench-sched", "--executor", "noop", "--slots", "64")
	w.WaitOutput(b, "worker started", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), run+5*time.Minute)
	defer cancel()
	nc := srv.Connect(b)
	c, err := client.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	// The schedules, made by 16 producers at once; the default overlap
	// policy (skip) reads the previous firing's job at each firing.
	names := make(chan string)
	var wg sync.WaitGroup
	var once sync.Once
	var createErr error
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				if _, err := c.CreateSchedule(ctx, &job.Schedule{Name: name, Every: dur(time.Second), Overlap: overlap,
					Template: &job.Request{Command: []string{"true"}}}); err != nil {
					once.Do(func() { createErr = fmt.Errorf("create schedule %s: %w", name, err) })
				}
			}
		}()
	}
	for i := range n {
		names <- fmt.Sprintf("bench-%04d", i)
	}
	close(names)
	wg.Wait()
	if createErr != nil {
		b.Fatal(createErr)
	}

	// Two seconds for the first firings to settle, then the run, from a
	// whole second to a whole second.
	time.Sleep(2 * time.Second)
	start := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(start))
	b.ResetTimer()
	cpu0, late0 := procCPU(b, d.Cmd.Process.Pid), scrapeLateness(b, addr)
	wcpu0, ncpu0 := procCPU(b, w.Cmd.Process.Pid), procCPU(b, os.Getpid())
	profiled := make(chan error, 1)
	if profile != "" {
		go func() { profiled <- fetchProfile(addr, run-time.Second, profile) }()
	} else {
		profiled <- nil
	}
	time.Sleep(run)
	end := start.Add(run)
	cpu1, late1 := procCPU(b, d.Cmd.Process.Pid), scrapeLateness(b, addr)
	wcpu1, ncpu1 := procCPU(b, w.Cmd.Process.Pid), procCPU(b, os.Getpid())
	b.StopTimer()
	if err := <-profiled; err != nil {
		b.Errorf("the dispatcher's CPU profile: %v", err)
	}
	time.Sleep(2 * time.Second) // the last slot's firings land

	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	// How late each firing was: to its job's version stored in the pool's
	// stream (the server's time: the job queued), and to its
	// submitted_at (the dispatcher's time, as the firing began to be
	// made).
	var lates, admitted []time.Duration
	twice := 0
	for _, recs := range allFirings(b, js, "default") {
		first := recs[0].rec
		at, err := time.Parse(job.FiringLayout, first.Labels[job.LabelFiring])
		if err != nil {
			b.Fatalf("job %s: %v", first.ID, err)
		}
		if at.Before(start) || !at.Before(end) {
			continue
		}
		if len(recs) > 1 {
			twice++
		}
		lates = append(lates, recs[0].stored.Sub(at))
		admitted = append(admitted, first.SubmittedAt.Sub(at))
	}
	slots := n * int(run/time.Second)
	if len(lates) == 0 {
		b.Fatal("no firing in the run")
	}
	slices.Sort(lates)
	slices.Sort(admitted)
	pct := func(l []time.Duration, p float64) time.Duration { return l[min(len(l)-1, int(p*float64(len(l))))] }
	secs := end.Sub(start).Seconds()
	cpu := (cpu1 - cpu0).Seconds() / secs * 100
	within := 100 * (late1.within - late0.within) / max(late1.count-late0.count, 1)
	b.ReportMetric(float64(pct(lates, 0.99).Microseconds())/1000, "p99-late-ms")
	b.ReportMetric(float64(pct(lates, 0.50).Microseconds())/1000, "p50-late-ms")
	b.ReportMetric(float64(len(lates))/secs, "firings/s")
	b.ReportMetric(cpu, "dispatcher-cpu-%")
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	b.Logf("%d schedules every second for %s: %d firings of %d slots made (%d queued twice); late (firing to its job stored) "+
		"p50 %s, p99 %s, max %s; to submitted_at p50 %s, p99 %s; queued within 100 ms (the dispatcher's histogram) %.2f%%; "+
		"dispatcher CPU %.0f%% of a core (%.2f ms per firing), the no-op worker's %.0f%%, this process's (the NATS server) %.0f%%",
		n, run, len(lates), slots, twice, r(pct(lates, 0.5)), r(pct(lates, 0.99)), r(lates[len(lates)-1]),
		r(pct(admitted, 0.5)), r(pct(admitted, 0.99)), within, cpu, (cpu1-cpu0).Seconds()*1000/float64(len(lates)),
		(wcpu1-wcpu0).Seconds()/secs*100, (ncpu1-ncpu0).Seconds()/secs*100)
	if twice > 0 {
		b.Errorf("%d firings queued twice", twice)
	}
}

// fetchProfile writes a CPU profile of the dispatcher at addr, taken for
// d, to file.
func fetchProfile(addr string, d time.Duration, file string) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// freeAddr is a loopback address with a port free now.
func freeAddr(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// procCPU is the CPU time (user and system) a process used so far.
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("the CPU of process %d: %v", pid, err)
	}
	// The fields after the command's name, which is in parentheses:
	// utime and stime are the 12th and 13th, in clock ticks (USER_HZ, 100
	// on Linux).
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

type lateness struct{ within, count float64 }

// scrapeLateness reads the dispatcher's lateness histogram: the firings
// queued within 100 ms, and all.
func scrapeLateness(b *testing.B, addr string) lateness {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatalf("the dispatcher's metrics: %v", err)
	}
	defer resp.Body.Close()
	var l lateness
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "fleet_schedule_lateness_seconds_bucket{") && strings.Contains(name, `le="0.1"`):
			l.within += v
		case strings.HasPrefix(name, "fleet_schedule_lateness_seconds_count"):
			l.count += v
		}
	}
	return l
}

// firingVersion is a version of a job a schedule queued, and when its
// pool's stream stored it.
type firingVersion struct {
	rec    *job.Record
	stored time.Time
}

// allFirings reads the first version of every job that a schedule queued
// in pool, by job id; a job queued twice shows as two.
func allFirings(b *testing.B, js jetstream.JetStream, pool string) map[string][]firingVersion {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, "FLEET_POOL_"+pool)
	if err != nil {
		b.Fatal(err)
	}
	var filters []string
	for p := job.HighestPriority; p <= job.LowestPriority; p++ {
		filters = append(filters, fmt.Sprintf("fleet.p.%s.q%d.>", pool, p))
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	if err != nil {
		b.Fatal(err)
	}
	out := map[string][]firingVersion{}
	for {
		batch, err := cons.FetchNoWait(1024)
		if err != nil {
			b.Fatal(err)
		}
		got, pending := 0, uint64(0)
		for m := range batch.Messages() {
			got++
			var rec job.Record
			if err := json.Unmarshal(m.Data(), &rec); err != nil {
				b.Fatal(err)
			}
			md, err := m.Metadata()
			if err != nil {
				b.Fatal(err)
			}
			if rec.Labels[job.LabelSchedule] != "" {
				out[rec.ID] = append(out[rec.ID], firingVersion{&rec, md.Timestamp})
			}
			pending = md.NumPending
		}
		if got == 0 || pending == 0 {
			return out
		}
	}
}
