package artifacts_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/job"
)

// bigOutput is the size of the large output: 200 MiB of random bytes.
const bigOutput = 200 * mib

// maxUploadRSS bounds what a worker's resident size grows by while its job
// writes bigOutput and it uploads it: the upload must stream, not hold the
// file (an eighth of it at most; it takes about 6 MiB here, idle or beside
// a second make test).
const maxUploadRSS = 24 * mib

// TestLargeBinaryOutputs runs a job writing 200 MiB of random bytes as its
// output, on a process worker and on a Docker worker, each a real worker
// process. The output comes back byte-identical through fleetctl output
// and through GET /v1/jobs/{id}/outputs/{name} (with its length and
// digest), and the worker's resident size, read from /proc once the
// upload is done, peaked less than 24 MiB above what it held at rest.
func TestLargeBinaryOutputs(t *testing.T) {
	f := fleettest.Start(t)
	const seed = "large-output"
	want := randomSHA256(t, seed, bigOutput)

	for _, tc := range []struct {
		executor string
		request  func(t *testing.T) *job.Request
	}{
		{"process", func(t *testing.T) *job.Request {
			return &job.Request{Command: []string{executortest.TestProgram(t), "random", "$FLEET_OUTPUTS/blob.bin", strconv.Itoa(bigOutput), seed}}
		}},
		{"docker", func(t *testing.T) *job.Request {
			return &job.Request{Image: dockertest.TestImage(t), PullPolicy: job.PullNever, Resources: &job.Resources{Memory: "128Mi"},
				Command: []string{"/testprog", "random", "$FLEET_OUTPUTS/blob.bin", strconv.Itoa(bigOutput), seed}}
		}},
	} {
		t.Run(tc.executor, func(t *testing.T) {
			req := tc.request(t)
			pool := "big-" + tc.executor
			w := startWorker(t, f, tc.executor, pool, "w-"+pool)
			atRest := restingRSS(t, w.Cmd.Process.Pid)

			req.Pool, req.Outputs, req.Timeout = pool, []string{"blob.bin"}, durationOf(5*time.Minute)
			start := time.Now()
			id := f.Submit(t, req)
			r := f.Await(t, id, 5*time.Minute)
			took := time.Since(start)
			if r.Status != job.StatusSucceeded {
				t.Fatalf("status %s: %+v", r.Status, r.Failure)
			}
			peak := peakRSS(t, w.Cmd.Process.Pid)
			t.Logf("%s worker: peak RSS %.1f MiB (%.1f MiB at rest before the job); job and upload of %d MiB took %s",
				tc.executor, float64(peak)/mib, float64(atRest)/mib, bigOutput/mib, took.Round(time.Millisecond))
			if peak-atRest >= maxUploadRSS {
				t.Errorf("the worker's resident size grew by %.1f MiB during the job and its upload, %d MiB or more", float64(peak-atRest)/mib, maxUploadRSS/mib)
			}
			if _, inline := r.Outputs["blob.bin"]; inline {
				t.Fatal("a 200 MiB binary output came back inline")
			}
			a, ok := r.Artifacts["blob.bin"]
			if !ok || a.Size != bigOutput || a.SHA256 != want || a.Key != "outputs/default/"+id+"/1/blob.bin" || a.Bucket != "fleet-artifacts-"+pool {
				t.Fatalf("artifact %+v, want %d bytes with SHA-256 %s", a, bigOutput, want)
			}

			// fleetctl output -o FILE
			file := filepath.Join(t.TempDir(), "blob.bin")
			start = time.Now()
			fleetctl(t, f, "output", id, "blob.bin", "-o", file)
			if sum, n := fileSHA256(t, file); sum != want || n != bigOutput {
				t.Errorf("fleetctl output: %d bytes, SHA-256 %s; want %s", n, sum, want)
			}
			t.Logf("fleetctl output: %s", time.Since(start).Round(time.Millisecond))

			// GET /v1/jobs/{id}/outputs/blob.bin
			start = time.Now()
			resp, sum, n := httpGet(t, f, "/v1/jobs/"+id+"/outputs/blob.bin")
			t.Logf("HTTP GET: %s", time.Since(start).Round(time.Millisecond))
			raw, _ := hex.DecodeString(want)
			switch {
			case resp.StatusCode != http.StatusOK:
				t.Errorf("GET output: %s", resp.Status)
			case sum != want || n != bigOutput:
				t.Errorf("GET output: %d bytes, SHA-256 %s; want %s", n, sum, want)
			case resp.ContentLength != bigOutput:
				t.Errorf("GET output: Content-Length %d", resp.ContentLength)
			case resp.Header.Get("Repr-Digest") != "sha-256=:"+base64.StdEncoding.EncodeToString(raw)+":":
				t.Errorf("GET output: Repr-Digest %q", resp.Header.Get("Repr-Digest"))
			case resp.Header.Get("ETag") != `"`+want+`"`:
				t.Errorf("GET output: ETag %q", resp.Header.Get("ETag"))
			}
		})
	}

	// A job that is not done yet, an output it never declared, a job that
	// does not exist.
	ctx := context.Background()
	id := f.Submit(t, &job.Request{Pool: "nobody", Command: []string{"true"}, Outputs: []string{"x"}})
	for path, code := range map[string]int{
		"/v1/jobs/" + id + "/outputs/x":       http.StatusConflict,
		"/v1/jobs/no-such-job/outputs/x":      http.StatusNotFound,
		"/v1/jobs/no-such-job/logs?attempt=1": http.StatusNotFound,
		"/v1/jobs/" + id + "/logs?attempt=0":  http.StatusBadRequest,
		"/v1/jobs/" + id + "/logs?attempt=2":  http.StatusNotFound,
	} {
		if resp, _, _ := httpGet(t, f, path); resp.StatusCode != code {
			t.Errorf("GET %s: %s, want %d", path, resp.Status, code)
		}
	}
	if _, err := f.Client.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	f.Await(t, id, 10*time.Second)
	if resp, _, _ := httpGet(t, f, "/v1/jobs/"+id+"/outputs/x"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("an output a cancelled job never wrote: %s", resp.Status)
	}
}

func durationOf(d time.Duration) *job.Duration {
	v := job.Duration(d)
	return &v
}
