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

// TestAdmissionPlacement holds GPU models and node selectors against what
// the pools' workers report in their inventories.
func TestAdmissionPlacement(t *testing.T) {
	kube := func(pool string, inv *job.Inventory) *job.Heartbeat {
		return &job.Heartbeat{WorkerID: pool + "-k", Pool: pool, Backend: "kubernetes", Health: job.HealthHealthy,
			GPUs: job.GPUs{Total: 8}, Inventory: inv}
	}
	docker := func(pool string, labels map[string]string, inv *job.Inventory) *job.Heartbeat {
		return &job.Heartbeat{WorkerID: pool + "-d", Pool: pool, Backend: "docker", Health: job.HealthHealthy,
			GPUs: job.GPUs{Total: 8}, Labels: labels, Inventory: inv}
	}
	pools := view([]*job.Heartbeat{
		kube("gpu", &job.Inventory{GPUs: []job.GPUModel{{Model: "H100", Count: 4}, {Model: "L4", Count: 1}},
			PlacementKeys: []string{"zone"},
			Nodes:         []job.Node{{Name: "a", Labels: map[string]string{"zone": "a", job.GPUModelLabel: "H100"}}, {Name: "b", Labels: map[string]string{"zone": "b"}}}}),
		kube("blind", &job.Inventory{PlacementKeys: []string{"zone"}}), // may not list nodes
		docker("hosts", map[string]string{"disk": "ssd"}, &job.Inventory{PlacementKeys: []string{"disk"}, GPUs: []job.GPUModel{{Model: "A100", Count: 2}}}),
	})
	req := func(pool string, gpu int, model string, sel map[string]string) *job.Request {
		r := &job.Request{Pool: pool, Image: "img", Resources: &job.Resources{GPU: gpu, GPUModel: model}}
		if sel != nil {
			r.Placement = &job.Placement{NodeSelector: sel}
		}
		r.Normalize()
		return r
	}
	for _, tc := range []struct {
		name string
		r    *job.Request
		want string
	}{
		{"a model the pool has", req("gpu", 2, "H100", nil), ""},
		{"a model the pool lacks names the models available", req("gpu", 1, "A100", nil), "1 GPUs of model A100 (the pool has 4×H100, 1×L4)"},
		{"more of a model than one node offers", req("gpu", 2, "L4", nil), "2 GPUs of model L4"},
		{"a selector a node matches", req("gpu", 0, "", map[string]string{"zone": "b"}), ""},
		{"a selector no node matches", req("gpu", 0, "", map[string]string{"zone": "c"}), "no node carries the labels zone=c"},
		{"a key the pool does not allow", req("gpu", 0, "", map[string]string{"rack": "1"}), `key "rack" is not one the pool allows (allowed: zone)`},
		{"nodes unknown: any value may match", req("blind", 0, "", map[string]string{"zone": "c"}), ""},
		{"models unknown: any model may be there", req("blind", 1, "H100", nil), ""},
		{"a Docker worker's labels are its host's", req("hosts", 0, "", map[string]string{"disk": "ssd"}), ""},
		{"a Docker worker without the label", req("hosts", 0, "", map[string]string{"disk": "hdd"}), "no node carries the labels disk=hdd"},
		{"a Docker host's GPU model", req("hosts", 2, "A100", nil), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := unfit(tc.r, pools[tc.r.Pool])
			if (tc.want == "") != (got == "") || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("unfit = %q, want %q", got, tc.want)
			}
		})
	}
}
