package artifacts_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// TestWorkerKilledDuringUpload SIGKILLs a worker process while it uploads
// a 128 MiB output: no object appears under the attempt's key, though its
// chunks were being stored; the job is run again by another worker, whose
// attempt's output is complete; the lost attempt's log keeps what it
// printed; the job has one result (historytest).
func TestWorkerKilledDuringUpload(t *testing.T) {
	const size = 128 * mib
	const seed = "killed-upload"
	f := fleettest.Start(t)
	prog := executortest.TestProgram(t)
	want := randomSHA256(t, seed, size)
	nc := f.NATS.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ear := historytest.Listen(t, nc, queue.Names{}, job.DefaultTenant, "killed")
	store := f.Artifacts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var objects jetstream.Stream
	stored := func() uint64 {
		info, err := objects.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Bytes
	}

	first := startWorker(t, f, "process", "killed", "w-killed-1")
	id := f.Submit(t, &job.Request{Pool: "killed", Outputs: []string{"blob.bin"}, Timeout: durationOf(2 * time.Minute),
		Command: []string{prog, "echo", "starting", "sleep", "1s", "random", "$FLEET_OUTPUTS/blob.bin", strconv.Itoa(size), seed}})

	// The pool's bucket was made with its stream, before the job was queued.
	if objects, err = js.Stream(ctx, "OBJ_fleet-artifacts-killed"); err != nil {
		t.Fatal(err)
	}
	// Kill it once its upload is under way: some megabytes stored.
	before := stored()
	for stored() < before+4*mib {
		if ctx.Err() != nil {
			t.Fatal("the upload never started")
		}
		time.Sleep(2 * time.Millisecond)
	}
	first.Kill()
	partial := stored() - before
	t.Logf("killed the worker with %.1f MiB of the upload stored", float64(partial)/mib)
	if partial >= size {
		t.Fatalf("the upload was done (%d bytes stored) before the kill", partial)
	}
	lostKey := artifact.OutputKey(job.DefaultTenant, id, 1, "blob.bin")
	if _, err := store.Stat(ctx, store.ArtifactsOf("killed"), lostKey); !errors.Is(err, artifact.ErrNotFound) {
		t.Fatalf("the killed upload's object: %v, want none", err)
	}
	obs, err := js.ObjectStore(ctx, "fleet-artifacts-killed")
	if err != nil {
		t.Fatal(err)
	}
	if list, err := obs.List(ctx); err == nil {
		for _, o := range list {
			if strings.HasPrefix(o.Name, "outputs/default/"+id+"/") {
				t.Errorf("object %s is listed after the kill", o.Name)
			}
		}
	}

	// Another worker runs the job again, after the ack wait.
	startWorker(t, f, "process", "killed", "w-killed-2")
	r := f.Await(t, id, 2*time.Minute)
	if r.Status != job.StatusSucceeded || r.Attempts != 2 || len(r.History) != 1 || r.History[0].Failure == nil ||
		r.History[0].Failure.Code != job.CodeWorkerLost {
		t.Fatalf("result %s after %d attempts, history %+v", r.Status, r.Attempts, r.History)
	}
	a := r.Artifacts["blob.bin"]
	if a.Key != artifact.OutputKey(job.DefaultTenant, id, 2, "blob.bin") || a.Size != size || a.SHA256 != want {
		t.Fatalf("the second attempt's output: %+v, want %d bytes with SHA-256 %s", a, size, want)
	}
	o, err := f.Client.Output(ctx, id, "blob.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	h := sha256.New()
	if n, err := io.Copy(h, o); err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != want {
		t.Fatalf("read back %d bytes, %v", n, err)
	}
	if _, err := store.Stat(ctx, store.ArtifactsOf("killed"), lostKey); !errors.Is(err, artifact.ErrNotFound) {
		t.Errorf("the killed upload's object after the retry: %v, want none", err)
	}
	// What the lost attempt printed before it was killed is kept.
	if out := fleetctl(t, f, "logs", id, "--attempt", "1"); out != "starting\n" {
		t.Errorf("the lost attempt's log: %q", out)
	}
	if out := fleetctl(t, f, "logs", id); out != "starting\n" {
		t.Errorf("the second attempt's log: %q", out)
	}
	historytest.Require(t, js, queue.Names{}, job.DefaultTenant, "killed", "", []string{id}, ear)
}
