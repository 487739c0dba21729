package artifact

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// BenchmarkOutputUpload measures how fast an attempt's output reaches the
// object store, against the object store client's own Put of the same
// bytes, in the same run: each iteration stores one file of
// FLEET_BENCH_UPLOAD_MIB (64 MiB) random bytes twice, once with
// jetstream.ObjectStore.Put reading the file, once as an output collected
// from an attempt's workspace (workspace.CollectTo, Attempt.StoreOutput),
// alternating which goes first. It reports both rates in MiB/s and their
// ratio (the target is at least 0.9).
func BenchmarkOutputUpload(b *testing.B) {
	size := int64(64)
	if v := os.Getenv("FLEET_BENCH_UPLOAD_MIB"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			b.Fatalf("FLEET_BENCH_UPLOAD_MIB=%q", v)
		}
		size = n
	}
	size <<= 20
	s, js := newStore(b, Config{})
	ctx := context.Background()
	obs, err := js.ObjectStore(ctx, s.Artifacts())
	if err != nil {
		b.Fatal(err)
	}
	dir, err := workspace.Create(b.TempDir(), "bench", 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(dir.Outputs, "blob.bin")
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	stream, err := js.Stream(ctx, "OBJ_"+s.Artifacts())
	if err != nil {
		b.Fatal(err)
	}

	raw := func(i int) time.Duration {
		f, err := os.Open(file)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		start := time.Now()
		if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: fmt.Sprintf("raw/%d", i)}, f); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	output := func(i int) time.Duration {
		a := s.Attempt(fmt.Sprintf("bench-%d", i), 1, &job.Request{}, AttemptOptions{})
		start := time.Now()
		_, stored, fail := dir.CollectTo(ctx, []string{"blob.bin"}, workspace.Limits{}, a)
		if fail != nil || stored["blob.bin"].Size != size {
			b.Fatalf("collect: %v %+v", fail, stored)
		}
		return time.Since(start)
	}
	var rawTime, outTime time.Duration
	b.SetBytes(2 * size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			rawTime += raw(i)
			outTime += output(i)
		} else {
			outTime += output(i)
			rawTime += raw(i)
		}
		// Keep the stream small: what was stored is dropped.
		b.StopTimer()
		if err := stream.Purge(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	mibs := func(d time.Duration) float64 { return float64(size) * float64(b.N) / (1 << 20) / d.Seconds() }
	b.ReportMetric(mibs(rawTime), "raw-MiB/s")
	b.ReportMetric(mibs(outTime), "output-MiB/s")
	b.ReportMetric(mibs(outTime)/mibs(rawTime), "ratio")
}

// BenchmarkLogLines measures archiving lines into an attempt's log.
func BenchmarkLogLines(b *testing.B) {
	s, _ := newStore(b, Config{})
	ctx := context.Background()
	w := s.NewLog(ctx, queue.JobKey{Tenant: job.DefaultTenant, Pool: job.DefaultPool, ID: "bench"}, 1, LogOptions{MaxBytes: 1 << 40})
	line := string(bytes.Repeat([]byte("x"), 80))
	now := time.Now()
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.Line(now, StreamStdout, line)
	}
	if _, err := w.Close(ctx); err != nil {
		b.Fatal(err)
	}
}
