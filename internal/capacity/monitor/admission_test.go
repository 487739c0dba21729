package monitor

import (
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

func ptr(v int64) *int64 { return &v }

func TestAdmissionUnfit(t *testing.T) {
	hb := func(pool, backend string, cpu, mem *int64, gpu int) *job.Heartbeat {
		return &job.Heartbeat{WorkerID: pool + backend, Pool: pool, Backend: backend, Health: job.HealthHealthy,
			CPUMilli: job.Amount{Total: cpu}, MemoryBytes: job.Amount{Total: mem}, GPUs: job.GPUs{Total: gpu}}
	}
	pools := view([]*job.Heartbeat{
		hb("small", "docker", ptr(2000), ptr(4<<30), 0),
		hb("small", "docker", ptr(4000), ptr(2<<30), 1),
		hb("procs", "process", nil, nil, 0),
	})
	req := func(pool, cpu, mem string, gpu int, image string) *job.Request {
		r := &job.Request{Pool: pool, Image: image, Command: []string{"x"}, Resources: &job.Resources{CPU: cpu, Memory: mem, GPU: gpu}}
		r.Normalize()
		return r
	}
	for _, tc := range []struct {
		r    *job.Request
		want string
	}{
		{req("small", "4", "4Gi", 1, "img"), ""}, // each total fits some worker
		{req("small", "5", "1Gi", 0, "img"), "needs 5 CPU (the largest worker has 4)"},
		{req("small", "1", "8Gi", 2, "img"), "needs 8Gi memory (the largest worker has 4Gi) and 2 GPUs"},
		{req("small", "1", "1Gi", 0, ""), "needs an image"},
		{req("procs", "64", "1Ti", 0, ""), ""}, // unknown totals: anything may fit
		{req("gone", "1", "1Gi", 0, ""), `pool "gone" has no live worker`},
	} {
		got := unfit(tc.r, pools[tc.r.Pool])
		if (tc.want == "") != (got == "") || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("unfit(%s %s %s gpu %d) = %q, want %q", tc.r.Pool, tc.r.Resources.CPU, tc.r.Resources.Memory, tc.r.Resources.GPU, got, tc.want)
		}
	}
}
