package longjobs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// TestKubePersist: on Kubernetes a job's data directory is a folder of the
// shared volume, mounted at /fleet/data of its pod; it goes when the job
// ends, and when the job is cancelled while it runs. (That a retry reads
// the checkpoint of an earlier attempt is the conformance suite's persist
// behaviour: the simulated node runs no container that could write one
// and then fail only once.)
func TestKubePersist(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	n := kubeNamespace(t)
	f.worker(t, n.workerArgs(t, "keeper", "k8s", "--data-retention", "1h")...)
	dataDir := func(id string) string { return filepath.Join(n.shared, ".fleet-data", id) }
	exists := func(path string) bool { _, err := os.Stat(path); return err == nil }

	for _, tc := range []struct {
		name   string
		cancel bool
	}{{"ends", false}, {"cancelled", true}} {
		id := "persist-" + tc.name
		r := longJob(id, "k8s", 4*time.Second)
		r.Outputs = nil
		r.Persist = &job.Persist{Enabled: true}
		if tc.cancel {
			r.Labels["fleet.test/duration"] = "1h"
		}
		f.Submit(t, r)
		pod := n.runningPod(t, id)
		mounted := false
		for _, m := range pod.Spec.Containers[0].VolumeMounts {
			if m.MountPath == "/fleet/data" && m.SubPath == ".fleet-data/"+id {
				mounted = true
			}
		}
		if !mounted || !exists(dataDir(id)) {
			t.Fatalf("%s: data folder there %v, mounts %+v; want %s mounted at /fleet/data", tc.name, exists(dataDir(id)),
				pod.Spec.Containers[0].VolumeMounts, dataDir(id))
		}
		// What the container would write.
		if err := os.WriteFile(filepath.Join(dataDir(id), "counter"), []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
		want := job.StatusSucceeded
		if tc.cancel {
			want = job.StatusCancelled
			if _, err := f.Client.Cancel(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}
		if res := f.Await(t, id, time.Minute); res.Status != want {
			t.Fatalf("%s: %s %+v, want %s", tc.name, res.Status, res.Failure, want)
		}
		waitFor(t, "the data folder of "+id+" to go", 10*time.Second, func() bool { return !exists(dataDir(id)) })
	}
}
