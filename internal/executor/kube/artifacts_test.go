package kube

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// TestInputByReference runs, on the control plane with the simulated node,
// a job whose input is a 50 MiB object of the fleet's object store (a real
// NATS server's): the worker fetches it onto the shared volume, the pod
// mounts that folder read-only at /fleet/inputs (the Secret keeps the env
// only), and the job's copy of it, written to /fleet/outputs as the
// container would (see play), comes back byte-identical, stored as an
// object.
func TestInputByReference(t *testing.T) {
	t.Parallel()
	n := namespaceOf(t)
	srv := natstest.Run(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := queue.Setup(ctx, js, queue.Config{MemoryStorage: true}, nil); err != nil {
		t.Fatal(err)
	}
	store := artifact.New(js, artifact.Config{})

	// 50 MiB of random bytes, uploaded as a producer would.
	const size = 50 << 20
	h := sha256.New()
	data := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{7}), size), h)
	ref, err := store.Put(ctx, store.Uploads(), "u/set.bin", bufio.NewReaderSize(data, 1<<20), artifact.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := hex.EncodeToString(h.Sum(nil))
	if ref.SHA256 != want {
		t.Fatalf("upload digest %s, want %s", ref.SHA256, want)
	}

	c := &executortest.Case{Behaviour: "input_ref", WorkerID: "input-ref-" + job.NewID()[20:],
		Program: executortest.Program{executortest.Copy("$FLEET_INPUTS/data/set.bin", "$FLEET_OUTPUTS/copy.bin")}}
	inst := newConformanceInstance(t, c)
	r := &job.Request{Env: map[string]string{"MODE": "fast"}, Inputs: map[string]string{"params.json": `{"n":1}`},
		InputRefs: map[string]job.InputRef{"data/set.bin": ref.InputRef()}, Outputs: []string{"copy.bin"}}
	inst.Complete(r)
	r.Normalize()
	task := &executor.Task{JobID: "input-ref", Attempt: 1, WorkerID: c.WorkerID, Pool: "default", Request: r,
		Artifacts: store.Attempt("input-ref", 1, r, artifact.AttemptOptions{})}

	done := make(chan struct{})
	go func() {
		defer close(done)
		checkInputMounts(t, n, c.WorkerID)
	}()
	out, err := inst.Executor.Run(ctx, task)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if out.Status != job.StatusSucceeded {
		t.Fatalf("status %s: %+v", out.Status, out.Failure)
	}
	a, ok := out.Artifacts["copy.bin"]
	if !ok || a.SHA256 != want || a.Size != size {
		t.Fatalf("the job's copy: %+v, want %d bytes with SHA-256 %s", a, size, want)
	}
	if left := inst.Left(t); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// checkInputMounts waits for the pod of worker's attempt and checks how
// its inputs reach it: the shared volume's inputs folder, read-only, with
// the inline input beside the fetched one; the Secret holds env only.
func checkInputMounts(t *testing.T, n *conformanceNamespace, worker string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		pods, err := n.c.env.Client.CoreV1().Pods(n.c.ns).List(ctx, metav1.ListOptions{LabelSelector: LabelWorkerID + "=" + labelValue(worker)})
		if err != nil || len(pods.Items) == 0 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		p := pods.Items[0]
		var vol, mount string
		readOnly := false
		for _, v := range p.Spec.Volumes {
			if v.Name == volumeInputs && v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly {
				vol = v.PersistentVolumeClaim.ClaimName
			}
		}
		for _, m := range p.Spec.Containers[0].VolumeMounts {
			if m.Name == volumeInputs {
				mount, readOnly = m.SubPath, m.ReadOnly
			}
		}
		if vol != "fleet-shared" || !readOnly || !strings.HasSuffix(mount, "/inputs") {
			t.Errorf("inputs volume %q mounted from %q (read-only %v), want the shared claim's inputs folder", vol, mount, readOnly)
			return
		}
		if got, err := os.ReadFile(filepath.Join(n.shared, filepath.FromSlash(mount), "params.json")); err != nil || string(got) != `{"n":1}` {
			t.Errorf("the inline input beside the fetched one: %q, %v", got, err)
		}
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == "MODE" && e.ValueFrom != nil {
				s, err := n.c.env.Client.CoreV1().Secrets(n.c.ns).Get(ctx, e.ValueFrom.SecretKeyRef.Name, metav1.GetOptions{})
				if err != nil {
					t.Errorf("the env's Secret: %v", err)
					return
				}
				for k := range s.Data {
					if strings.HasPrefix(k, "input-") {
						t.Errorf("the Secret still holds input %s", k)
					}
				}
			}
		}
		return
	}
	t.Error("no pod appeared")
}
