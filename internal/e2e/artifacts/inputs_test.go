package artifacts_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// bigInput is the size of the input by reference: 50 MiB of random bytes.
const bigInput = 50 * mib

// TestInputByReference uploads a 50 MiB random file and runs a job that
// copies its input to an output, on a process worker and on a Docker
// worker: the copy is byte-identical. The process job is submitted with
// fleetctl submit --input (which uploads), the Docker job with a
// reference from fleetctl upload. (The Kubernetes executor's test is in
// internal/executor/kube: TestInputByReference.)
func TestInputByReference(t *testing.T) {
	f := fleettest.Start(t)
	const seed = "big-input"
	file := randomFile(t, seed, bigInput)
	want, _ := fileSHA256(t, file)

	t.Run("process", func(t *testing.T) {
		startWorker(t, f, "process", "in-process", "w-in-process")
		req, _ := json.Marshal(&job.Request{Pool: "in-process", Outputs: []string{"copy.bin"},
			Command: []string{executortest.TestProgram(t), "copy", "$FLEET_INPUTS/data/set.bin", "$FLEET_OUTPUTS/copy.bin"}})
		reqFile := filepath.Join(t.TempDir(), "job.json")
		if err := os.WriteFile(reqFile, req, 0o644); err != nil {
			t.Fatal(err)
		}
		id := strings.TrimSpace(fleetctl(t, f, "submit", "-f", reqFile, "--input", "data/set.bin=@"+file))
		checkCopy(t, f, id, want)
	})

	t.Run("docker", func(t *testing.T) {
		image := dockertest.TestImage(t)
		startWorker(t, f, "docker", "in-docker", "w-in-docker")
		var ref job.InputRef
		if err := json.Unmarshal([]byte(fleetctl(t, f, "upload", file, "--name", "inputs/set.bin")), &ref); err != nil {
			t.Fatal(err)
		}
		if ref.Key != "inputs/set.bin" || ref.SHA256 != want || ref.Size == nil || *ref.Size != bigInput {
			t.Fatalf("fleetctl upload printed %+v", ref)
		}
		id := f.Submit(t, &job.Request{Pool: "in-docker", Image: image, PullPolicy: job.PullNever, Outputs: []string{"copy.bin"},
			Resources: &job.Resources{Memory: "256Mi"}, InputRefs: map[string]job.InputRef{"set.bin": ref},
			Command: []string{"/testprog", "copy", "$FLEET_INPUTS/set.bin", "$FLEET_OUTPUTS/copy.bin"}})
		checkCopy(t, f, id, want)
	})
}

// checkCopy checks that job id succeeded with copy.bin of digest want.
func checkCopy(t *testing.T, f *fleettest.Fleet, id, want string) {
	t.Helper()
	r := f.Await(t, id, 3*time.Minute)
	if r.Status != job.StatusSucceeded {
		t.Fatalf("status %s: %+v", r.Status, r.Failure)
	}
	if a := r.Artifacts["copy.bin"]; a.SHA256 != want || a.Size != bigInput {
		t.Fatalf("the job's copy of its input: %+v, want %d bytes with SHA-256 %s", a, bigInput, want)
	}
}

// TestInputsThatAreNotThere: a request naming an object that was never
// uploaded, or whose digest differs, is rejected at admission with the
// reason; an object that changes after admission fails the attempt
// (rejected/input_changed), before the job runs and without leaving a file.
func TestInputsThatAreNotThere(t *testing.T) {
	f := fleettest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ref, err := f.Client.Upload(ctx, "u/params.json", strings.NewReader(`{"n": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	missing := *ref
	missing.Key = "u/never-uploaded.json"
	wrong := *ref
	wrong.SHA256 = strings.Repeat("0", 64)
	for _, tc := range []struct {
		ref  job.InputRef
		says string
	}{
		{missing, "no object u/never-uploaded.json in bucket fleet-uploads"},
		{wrong, "its SHA-256 is"},
		{job.InputRef{Bucket: "someone-elses", Key: "k", SHA256: ref.SHA256}, "not one of the fleet's buckets"},
	} {
		_, err := f.Client.Submit(ctx, &job.Request{Command: []string{"true"}, InputRefs: map[string]job.InputRef{"in.json": tc.ref}})
		var rej *client.RejectedError
		if !errors.As(err, &rej) || !strings.Contains(rej.Reason, tc.says) {
			t.Errorf("submit with %+v: %v, want a rejection saying %q", tc.ref, err, tc.says)
		}
	}

	// Accepted while the object matched; changed before a worker fetched it.
	id := f.Submit(t, &job.Request{Command: []string{"sh", "-c", "touch $FLEET_WORK/ran"},
		InputRefs: map[string]job.InputRef{"in.json": *ref}})
	if _, err := f.Client.Upload(ctx, "u/params.json", strings.NewReader(`{"n": 2}`)); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e, err := process.New(process.Config{Dir: dir, KeepFailed: true})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, e, worker.Config{Artifacts: f.Artifacts(t)})
	r := f.Await(t, id, 30*time.Second)
	if r.Status != job.StatusFailed || r.Failure.Class != job.ClassRejected || r.Failure.Code != job.CodeInputChanged || r.Attempts != 1 {
		t.Fatalf("result %s, %d attempts: %+v", r.Status, r.Attempts, r.Failure)
	}
	// Nothing ran, and no workspace (not even a kept one) holds the input.
	if out, _ := exec.Command("find", dir, "-name", "in.json*", "-o", "-name", "ran").Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("left behind: %s", out)
	}
}
