package telemetry_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// One test, because telemetry is global to the process: a trace from the
// producer's span through submit and attempt to the result, and the
// metrics those jobs leave.
func TestTracesAndMetricsOfJobs(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{Service: "fleet-test", SpanExporter: spans})
	if err != nil {
		t.Fatal(err)
	}
	f := fleettest.Start(t)
	exec, err := process.New(process.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, exec, worker.Config{Slots: 4})

	t.Run("one trace from submit to result", func(t *testing.T) {
		ctx, root := otel.Tracer("producer").Start(context.Background(), "produce")
		traceID := root.SpanContext().TraceID().String()
		sub, err := f.Client.Submit(ctx, &job.Request{ID: "traced", Command: []string{"sh", "-c", "echo x > $FLEET_OUTPUTS/o"}, Outputs: []string{"o"}})
		root.End()
		if err != nil {
			t.Fatal(err)
		}
		r := f.Await(t, sub.JobID, 20*time.Second)
		if r.TraceID != traceID {
			t.Errorf("result trace_id %q, want the producer's %q", r.TraceID, traceID)
		}
		for _, e := range f.Events(t, sub.JobID, 10*time.Second) {
			if e.TraceID != traceID {
				t.Errorf("%s event trace_id %q", e.Type, e.TraceID)
			}
		}
		if err := tel.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		byName := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range spans.GetSpans().Snapshots() {
			if s.SpanContext().TraceID().String() == traceID {
				byName[s.Name()] = s
			}
		}
		parentOf := func(child, parent string) {
			c, p := byName[child], byName[parent]
			if c == nil || p == nil {
				t.Errorf("missing span %s or %s in the trace; have %v", child, parent, names(byName))
				return
			}
			if c.Parent().SpanID() != p.SpanContext().SpanID() {
				t.Errorf("%s is not a child of %s", child, parent)
			}
		}
		parentOf("fleet.submit", "produce")
		parentOf("fleet.attempt", "fleet.submit")
		parentOf("fleet.run", "fleet.attempt")
		parentOf("fleet.outputs.collect", "fleet.attempt")
	})

	t.Run("metrics after a few jobs", func(t *testing.T) {
		for _, id := range []string{"m1", "m2", "m3"} {
			f.Submit(t, &job.Request{ID: id, Command: []string{"true"}})
		}
		f.Submit(t, &job.Request{ID: "m4", Command: []string{"sh", "-c", "exit 3"},
			Retry: &job.RetryPolicy{MaxAttempts: 2, InitialBackoff: ptr(job.Duration(50 * time.Millisecond))}})
		for _, id := range []string{"m1", "m2", "m3", "m4"} {
			f.Await(t, id, 20*time.Second)
		}
		srv := httptest.NewServer(tel.Metrics)
		defer srv.Close()
		scrape := func() map[string]*dto.MetricFamily {
			resp, err := srv.Client().Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			p := expfmt.NewTextParser(model.UTF8Validation)
			families, err := p.TextToMetricFamilies(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return families
		}
		value := func(families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
			fam := families[name]
			if fam == nil {
				return -1
			}
		next:
			for _, m := range fam.Metric {
				for k, v := range labels {
					if !hasLabel(m, k, v) {
						continue next
					}
				}
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Histogram != nil:
					return float64(m.Histogram.GetSampleCount())
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				}
			}
			return -1
		}
		pool := map[string]string{"pool": "default"}
		// The traced job of the first subtest counts too: five jobs.
		want := []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"fleet_dispatcher_jobs_submitted_total", pool, 5},
			{"fleet_worker_attempts_started_total", pool, 6},
			{"fleet_worker_jobs_finished_total", map[string]string{"pool": "default", "status": "succeeded"}, 4},
			{"fleet_worker_jobs_finished_total", map[string]string{"pool": "default", "status": "failed"}, 1},
			{"fleet_worker_retries_total", map[string]string{"pool": "default", "class": "execution"}, 1},
			{"fleet_worker_attempt_duration_seconds", map[string]string{"status": "succeeded"}, 4},
			{"fleet_worker_attempt_duration_seconds", map[string]string{"status": "failed"}, 2},
			{"fleet_worker_queue_wait_seconds", pool, 5},
			{"fleet_worker_slots", map[string]string{"state": "total"}, 4},
		}
		// A worker counts a job finished just after its result is out:
		// scrape until the counts settle.
		var families map[string]*dto.MetricFamily
		var wrong []string
		for deadline := time.Now().Add(5 * time.Second); ; {
			families, wrong = scrape(), nil
			for _, c := range want {
				if got := value(families, c.name, c.labels); got != c.want {
					wrong = append(wrong, fmt.Sprintf("%s%v = %g, want %g", c.name, c.labels, got, c.want))
				}
			}
			if len(wrong) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, w := range wrong {
			t.Error(w)
		}
		for name := range families {
			if strings.Contains(name, "job_id") {
				t.Errorf("a metric is labelled by job id: %s", name)
			}
		}
		for _, fam := range families {
			for _, m := range fam.Metric {
				for _, l := range m.Label {
					if l.GetName() == "job_id" || strings.HasPrefix(l.GetValue(), "m1") {
						t.Errorf("%s carries a job id label", fam.GetName())
					}
				}
			}
		}
	})
	_ = tel.Shutdown(context.Background())
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.Label {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

func names(m map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
