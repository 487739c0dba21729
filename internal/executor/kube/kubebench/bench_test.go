// Package kubebench measures a fleet job on Kubernetes against the bare Job
// cycle, on one control plane of internal/kubetest (kwok plays the node,
// whose pods run for a second):
//
//   - the fleet: a job submitted to an in-process dispatcher on an embedded
//     NATS server and followed, as `fleetctl submit --wait` does, to its
//     final event and its result, run by an in-process worker with the
//     Kubernetes executor (4 slots);
//   - the bare cycle: the same Job spec created with client-go, waited for
//     until its Complete condition, as `kubectl create -f job.yaml` then
//     `kubectl wait --for=condition=complete` do, then deleted (untimed).
//
// Each round alternates the two, first one job at a time, then 4 at once
// (4 clients, each submitting its next job when the last one ends). The
// pods ask for cpu 1 and memory 256Mi, the node has 4 CPUs: 4 at once fill
// it. Run it with
//
//	go test -run '^$' -bench KubeFleetAgainstBareJob -benchtime 1x ./internal/executor/kube/kubebench/
//
// (scripts/bench-kube.sh, from make bench). KUBE_ROUNDS (3), KUBE_JOBS (10
// per round and side, one at a time) and KUBE_JOBS_4 (12 per round and
// side, 4 at once) change its size.
package kubebench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/executor/kube"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

const pool = "k8s"

type bench struct {
	env    *kubetest.Env
	ns     string
	client *client.Client
	// spec is the Job the fleet made for a job, to create bare.
	spec *batchv1.Job
}

func BenchmarkKubeFleetAgainstBareJob(b *testing.B) {
	rounds, serial, together := envInt("KUBE_ROUNDS", 3), envInt("KUBE_JOBS", 10), envInt("KUBE_JOBS_4", 12)
	env := kubetest.Start(b)
	ns := env.NewNamespace(b)
	env.SetPodLogs(b, ns) // an empty log, as `true` prints
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	exec, err := kube.New(kube.Config{Client: env.Client, Namespace: ns, WorkerID: "bench", Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = exec.Close() })
	f := fleettest.Start(b)
	f.Worker(b, exec, worker.Config{ID: "bench", Pool: pool, Slots: 4, Backend: "kubernetes", Logger: quiet})
	bn := &bench{env: env, ns: ns, client: f.Client}
	if err := bn.warmUp(); err != nil {
		b.Fatal(err)
	}

	fmt.Printf("kubernetes: a job of cpu 1, memory 256Mi whose pod runs 1 s (kwok), on a node of 4 CPUs: the fleet (submit, then its events and result, as fleetctl submit --wait; one worker, 4 slots) against the bare Job cycle of the same spec (create, then wait for Complete, as kubectl wait); %d rounds, alternating\n", rounds)
	var fs, bs, ft, bt, rs, rt []float64
	for r := 1; r <= rounds; r++ {
		// Which goes first alternates.
		measure := func(n, at int) (fleet, bare []time.Duration) {
			if r%2 == 1 {
				fleet = bn.run(b, n, at, bn.fleetJob)
				bare = bn.run(b, n, at, bn.bareJob)
			} else {
				bare = bn.run(b, n, at, bn.bareJob)
				fleet = bn.run(b, n, at, bn.fleetJob)
			}
			return fleet, bare
		}
		f1, b1 := measure(serial, 1)
		f4, b4 := measure(together, 4)
		fs, bs, ft, bt = append(fs, mean(f1)), append(bs, mean(b1)), append(ft, mean(f4)), append(bt, mean(b4))
		rs, rt = append(rs, mean(f1)/mean(b1)), append(rt, mean(f4)/mean(b4))
		fmt.Printf("round %d, one at a time, %d each: fleet %s; bare %s; fleet / bare %.2fx\n", r, serial, describe(f1), describe(b1), rs[r-1])
		fmt.Printf("round %d, 4 at once, %d each:     fleet %s; bare %s; fleet / bare %.2fx\n", r, together, describe(f4), describe(b4), rt[r-1])
	}
	fmt.Printf("kubernetes, one at a time: fleet %s ms per job; the bare Job cycle: %s ms; fleet / bare: %s over %d rounds\n", spread(fs, "%.0f"), spread(bs, "%.0f"), spread(rs, "%.2fx"), rounds)
	fmt.Printf("kubernetes, 4 at once:     fleet %s ms per job; the bare Job cycle: %s ms; fleet / bare: %s over %d rounds\n", spread(ft, "%.0f"), spread(bt, "%.0f"), spread(rt, "%.2fx"), rounds)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(average(rs), "fleet/bare-1")
	b.ReportMetric(average(rt), "fleet/bare-4")
}

// warmUp runs a fleet job, keeping the Job the fleet made for it as the
// spec of the bare cycle, and a bare one.
func (bn *bench) warmUp() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := bn.env.Client.BatchV1().Jobs(bn.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("watch Jobs: %w", err)
	}
	defer w.Stop()
	if _, err := bn.fleetJob("warm-up"); err != nil {
		return err
	}
	for ev := range w.ResultChan() {
		if j, ok := ev.Object.(*batchv1.Job); ok && ev.Type == watch.Added {
			bn.spec = bareSpec(j)
			break
		}
	}
	if bn.spec == nil {
		return fmt.Errorf("the fleet made no Job: %w", ctx.Err())
	}
	_, err = bn.bareJob("warm-up")
	return err
}

// bareSpec is the Job the fleet made, as a user would write it: the same
// spec, without the fleet's labels (so that no worker follows it) and
// without what the API server added.
func bareSpec(fleet *batchv1.Job) *batchv1.Job {
	labels := map[string]string{"app": "bare"}
	tmpl := fleet.Spec.Template.DeepCopy()
	tmpl.Labels, tmpl.Annotations = labels, nil
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit:            fleet.Spec.BackoffLimit,
			ActiveDeadlineSeconds:   fleet.Spec.ActiveDeadlineSeconds,
			TTLSecondsAfterFinished: fleet.Spec.TTLSecondsAfterFinished,
			Template:                *tmpl,
		},
	}
}

// fleetJob submits a job and follows it, as fleetctl submit --wait does,
// to its final event, then reads its result; it returns how long that
// took.
func (bn *bench) fleetJob(id string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := &job.Request{ID: id, Pool: pool, Image: "registry.example/tools:1", Command: []string{"true"},
		Resources: &job.Resources{CPU: "1", Memory: "256Mi"}}
	begin := time.Now()
	sub, err := bn.client.Submit(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("submit %s: %w", id, err)
	}
	for ev, err := range bn.client.Events(ctx, sub.JobID) {
		if err != nil {
			return 0, fmt.Errorf("events of %s: %w", id, err)
		}
		if ev.Type.Final() {
			break
		}
	}
	res, err := bn.client.Result(ctx, sub.JobID)
	if err != nil {
		return 0, fmt.Errorf("result of %s: %w", id, err)
	}
	took := time.Since(begin)
	if res.Status != job.StatusSucceeded {
		return 0, fmt.Errorf("job %s: %s %+v", id, res.Status, res.Failure)
	}
	return took, nil
}

// bareJob creates the Job and waits for its Complete condition, as kubectl
// wait does (a watch of that Job); then it deletes it, untimed.
func (bn *bench) bareJob(name string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	jobs := bn.env.Client.BatchV1().Jobs(bn.ns)
	j := bn.spec.DeepCopy()
	j.Name = "bare-" + name
	begin := time.Now()
	created, err := jobs.Create(ctx, j, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("create Job %s: %w", j.Name, err)
	}
	w, err := jobs.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", j.Name).String(),
		ResourceVersion: created.ResourceVersion})
	if err != nil {
		return 0, fmt.Errorf("watch Job %s: %w", j.Name, err)
	}
	var took time.Duration
	var failed *batchv1.JobCondition
	for ev := range w.ResultChan() {
		o, ok := ev.Object.(*batchv1.Job)
		if !ok {
			continue
		}
		if c := condition(o, batchv1.JobComplete); c != nil {
			took = time.Since(begin)
			break
		}
		if failed = condition(o, batchv1.JobFailed); failed != nil {
			break
		}
	}
	w.Stop()
	switch {
	case failed != nil:
		return 0, fmt.Errorf("Job %s failed: %s: %s", j.Name, failed.Reason, failed.Message)
	case took == 0:
		return 0, fmt.Errorf("Job %s did not complete: %w", j.Name, ctx.Err())
	}
	bg := metav1.DeletePropagationBackground
	if err := jobs.Delete(context.Background(), j.Name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		return 0, fmt.Errorf("delete Job %s: %w", j.Name, err)
	}
	return took, nil
}

func condition(j *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i, c := range j.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return &j.Status.Conditions[i]
		}
	}
	return nil
}

var seq atomic.Int64

// run runs n jobs through one, at most at of them at once, each starting
// when one before it ended, and returns how long each took.
func (bn *bench) run(b *testing.B, n, at int, one func(name string) (time.Duration, error)) []time.Duration {
	b.Helper()
	var mu sync.Mutex
	var out []time.Duration
	var errs []error
	next := make(chan int64, n)
	for range n {
		next <- seq.Add(1)
	}
	close(next)
	var wg sync.WaitGroup
	for range at {
		wg.Go(func() {
			for i := range next {
				d, err := one("j" + strconv.FormatInt(i, 10))
				mu.Lock()
				out, errs = append(out, d), append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// describe is the mean, median and range of times.
func describe(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%.0f ms per job (median %d, %d–%d)", mean(ds), s[len(s)/2].Milliseconds(), s[0].Milliseconds(), s[len(s)-1].Milliseconds())
}

func mean(ds []time.Duration) float64 {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum.Microseconds()) / 1000 / float64(len(ds))
}

func average(v []float64) float64 {
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// spread is "min–max" of the rounds' figures, or the one figure.
func spread(v []float64, format string) string {
	lo, hi := fmt.Sprintf(format, slices.Min(v)), fmt.Sprintf(format, slices.Max(v))
	if lo == hi {
		return lo
	}
	return lo + "–" + hi
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
