package kube

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

func ownedJob(name, workerID string) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: ownerLabels(workerID)}}
}

func TestRecover(t *testing.T) {
	shared := t.TempDir()
	left, err := workspace.Create(filepath.Join(shared, "worker-1"), "job-9", 1, map[string]string{"in.txt": "x"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := workspace.Create(filepath.Join(shared, "worker-2"), "job-8", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	var objects []runtime.Object
	for _, j := range []*batchv1.Job{ownedJob("mine-1", "worker-1"), ownedJob("mine-2", "worker-1"), ownedJob("theirs", "worker-2")} {
		objects = append(objects, j)
	}
	b := setup(t, func(c *Config) { c.SharedPVC, c.SharedDir = "shared", shared }, objects...)

	if err := b.exec.Recover(context.Background(), "worker-1"); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	jobs, _ := b.client.BatchV1().Jobs(ns).List(context.Background(), metav1.ListOptions{})
	if len(jobs.Items) != 1 || jobs.Items[0].Name != "theirs" {
		t.Errorf("Jobs left: %v, want only the other worker's", jobs.Items)
	}
	var selector string
	for _, a := range b.client.Actions() {
		if a.GetVerb() == "delete-collection" && a.GetResource().Resource == "secrets" {
			selector = a.(k8stesting.DeleteCollectionAction).GetListRestrictions().Labels.String()
		}
	}
	equal(t, "Secrets deleted by", selector, "app.kubernetes.io/managed-by=fleet,fleet.dev/worker-id=worker-1")
	if _, err := os.Stat(left.Root); !os.IsNotExist(err) {
		t.Errorf("the earlier life's outputs folder is still there: %v", err)
	}
	if _, err := os.Stat(other.Root); err != nil {
		t.Errorf("the other worker's outputs folder is gone: %v", err)
	}
}

func quota(name string, hard corev1.ResourceList, scopes ...corev1.ResourceQuotaScope) *corev1.ResourceQuota {
	return &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.ResourceQuotaSpec{Hard: hard, Scopes: scopes},
	}
}

func TestCapacity(t *testing.T) {
	q := resource.MustParse
	for _, tc := range []struct {
		name   string
		quotas []runtime.Object
		want   string
	}{
		{"no quota: unknown", nil, "cpu=nil memory=nil gpus=0"},
		{"requests", []runtime.Object{quota("q", corev1.ResourceList{"requests.cpu": q("4"), "requests.memory": q("8Gi"), "requests.nvidia.com/gpu": q("2")})},
			"cpu=4000 memory=8589934592 gpus=2"},
		{"limits, divided by the ratios", []runtime.Object{quota("q", corev1.ResourceList{"limits.cpu": q("8"), "limits.memory": q("12Gi")})},
			"cpu=4000 memory=8589934592 gpus=0"},
		{"the tightest of several", []runtime.Object{
			quota("a", corev1.ResourceList{"cpu": q("3"), "memory": q("1Gi")}),
			quota("b", corev1.ResourceList{"requests.cpu": q("2500m"), "pods": q("10")}),
		}, "cpu=2500 memory=1073741824 gpus=0"},
		{"a quota of other pods", []runtime.Object{quota("long-running", corev1.ResourceList{"cpu": q("1")}, corev1.ResourceQuotaScopeNotTerminating)},
			"cpu=nil memory=nil gpus=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, nil, tc.quotas...)
			if err := b.exec.synced(context.Background()); err != nil {
				t.Fatal(err)
			}
			c, err := b.exec.Capacity(context.Background())
			if err != nil {
				t.Fatalf("Capacity: %v", err)
			}
			equal(t, "capacity", capacityString(c.CPUMilli, c.MemoryBytes, c.GPUs), tc.want)
			equal(t, "health", c.Health, job.HealthHealthy)
			if c.Containers == nil {
				t.Error("no pod counts")
			}
		})
	}
}

func capacityString(cpu, mem *int64, gpus int) string {
	s := func(v *int64) string {
		if v == nil {
			return "nil"
		}
		return strconv.FormatInt(*v, 10)
	}
	return "cpu=" + s(cpu) + " memory=" + s(mem) + " gpus=" + strconv.Itoa(gpus)
}
