// Package artifacts_test tests the fleet's files end to end: outputs of
// any size and bytes, inputs by reference and whole logs, through the
// real object store of a real NATS server, workers running as processes
// (whose memory the tests measure and which they SIGKILL), the process
// and Docker executors, fleetctl and the HTTP API.
package artifacts_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/fleettest"
)

const mib = 1 << 20

// randomBytes is the stream testprog's random step writes (ChaCha8 keyed
// with the SHA-256 of seed), so that a test knows what a job wrote.
func randomBytes(seed string) io.Reader {
	return rand.NewChaCha8(sha256.Sum256([]byte(seed)))
}

// randomSHA256 is the digest of the first n bytes of randomBytes(seed).
func randomSHA256(t testing.TB, seed string, n int64) string {
	t.Helper()
	h := sha256.New()
	if _, err := io.CopyN(h, randomBytes(seed), n); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// randomFile writes n bytes of randomBytes(seed) to a file of the test.
func randomFile(t testing.TB, seed string, n int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), seed+".bin")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, mib)
	if _, err := io.CopyN(w, randomBytes(seed), n); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// fileSHA256 is the digest and size of a file.
func fileSHA256(t testing.TB, p string) (string, int64) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// startWorker starts a worker process of pool on the fleet's NATS, without
// Redis, and waits until it pulls.
func startWorker(t testing.TB, f *fleettest.Fleet, executor, pool, id string, args ...string) *fleettest.Proc {
	t.Helper()
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL=", "FLEET_DATA_DIR=" + t.TempDir()}
	all := append([]string{"--executor", executor, "--pool", pool, "--id", id, "--slots", "2", "--grace", "1s",
		"--ack-wait", "5s"}, args...)
	p := fleettest.StartProc(t, "worker", env, all...)
	p.WaitOutput(t, "worker started", 60*time.Second)
	return p
}

// peakRSS is the peak resident size of a process (VmHWM), in bytes.
func peakRSS(t testing.TB, pid int) int64 { return procStatus(t, pid, "VmHWM") }

// restingRSS resets the peak resident size of a process to what it holds
// now, and returns that (VmRSS), in bytes: what a later peakRSS exceeds it
// by is what the process took meanwhile, whatever it reached before (its
// start's peak depends on the garbage collector's pace, so on the load).
func restingRSS(t testing.TB, pid int) int64 {
	t.Helper()
	// 5: reset the peak resident size (proc(5), since Linux 4.0).
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("reset the peak resident size of %d: %v", pid, err)
	}
	return procStatus(t, pid, "VmRSS")
}

// procStatus reads field, a size in kB, from /proc/<pid>/status, in bytes.
func procStatus(t testing.TB, pid int, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", field, v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// fleetctl runs fleetctl against the fleet and returns its standard output;
// it fails the test unless fleetctl exits 0.
func fleetctl(t testing.TB, f *fleettest.Fleet, args ...string) string {
	t.Helper()
	cmd := exec.Command(fleettest.Binary(t, "fleetctl"), args...)
	cmd.Env = append(os.Environ(), "FLEET_NATS_URL="+f.NATS.URL())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fleetctl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// httpGet fetches a path of the fleet's HTTP API into sha256 and returns
// the response (its body read and closed), the digest and the size.
func httpGet(t testing.TB, f *fleettest.Fleet, path string) (*http.Response, string, int64) {
	t.Helper()
	resp, err := http.Get(f.API.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v after %d bytes", path, err, n)
	}
	return resp, hex.EncodeToString(h.Sum(nil)), n
}
