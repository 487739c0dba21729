package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

func TestPoolSetReadsItsFlags(t *testing.T) {
	var w, q tenantValues
	for _, v := range []string{"acme=3", "beta=0.5"} {
		if err := w.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{"acme=2", "beta=cpu=4,memory=8Gi,gpu=1", "gamma=none"} {
		if err := q.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	c, err := policyChange(w, q, 10, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if c.Weights["acme"] != 3 || c.Weights["beta"] != 0.5 || c.Quotas["acme"].Slots != 2 || c.Quotas["beta"].GPU != 1 ||
		c.Quotas["beta"].Memory != "8Gi" || !c.Quotas["gamma"].IsZero() || *c.MaxRunning != 10 || c.HalfLife.Std() != 5*time.Minute {
		t.Errorf("change: %+v", c)
	}
	for _, bad := range []struct {
		weight, quota string
		want          string
	}{
		{weight: "acme=lots", want: "not a number"},
		{weight: "acme=-1", want: "negative"},
		{quota: "acme=cpu=lots", want: "acme"},
		{quota: "acme=disk=1", want: "acme"},
	} {
		var w, q tenantValues
		if bad.weight != "" {
			_ = w.Set(bad.weight)
		}
		if bad.quota != "" {
			_ = q.Set(bad.quota)
		}
		if _, err := policyChange(w, q, -1, 0); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want an error naming %q", bad, err, bad.want)
		}
	}
	if _, err := policyChange(nil, nil, -1, 0); err == nil {
		t.Error("pool set with nothing to set was accepted")
	}
	if err := w.Set("not a tenant=1"); err == nil {
		t.Error("a bad tenant name was accepted")
	}
}

// TestPoolShowPrintsWhatPoolSetTakes: the sharing line of pool show,
// pasted after pool set, sets the same policy on another pool.
func TestPoolShowPrintsWhatPoolSetTakes(t *testing.T) {
	for _, q := range []job.Quota{{Slots: 2}, {CPU: "4", Memory: "8Gi"}, {Slots: 3, GPU: 1}} {
		back, err := job.ParseQuota(quotaFlag(q))
		if err != nil || back != q {
			t.Errorf("quota %+v: written %q, read back %+v, %v", q, quotaFlag(q), back, err)
		}
	}
	if s := quotaFlag(job.Quota{Slots: 2}); s != "2" {
		t.Errorf("a quota of 2 slots is written %q, not as --quota takes it: 2", s)
	}

	f := fleettest.Start(t)
	url := f.NATS.URL()
	sharing := func(pool string) string {
		t.Helper()
		code, out, errOut := fleetctl(t, "--nats-url", url, "pool", "show", pool)
		if code != exitOK {
			t.Fatalf("pool show %s: exit %d, %s", pool, code, errOut)
		}
		for _, line := range strings.Split(out, "\n") {
			if s, ok := strings.CutPrefix(line, "sharing: "); ok {
				return s
			}
		}
		t.Fatalf("pool show %s printed no sharing line:\n%s", pool, out)
		return ""
	}
	policy := func(pool string) string {
		t.Helper()
		code, out, errOut := fleetctl(t, "--nats-url", url, "-o", "json", "pool", "show", pool)
		if code != exitOK {
			t.Fatalf("pool show %s -o json: exit %d, %s", pool, code, errOut)
		}
		var s job.PoolState
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatal(err)
		}
		p, _ := json.Marshal(s.Policy)
		return string(p)
	}

	if s := sharing("src"); s != "equal (no weight, quota or bound set)" {
		t.Errorf("a pool without a policy: sharing %q", s)
	}
	code, _, errOut := fleetctl(t, "--nats-url", url, "pool", "set", "src", "--weight", "acme=3", "--weight", "beta=0.5",
		"--quota", "beta=2", "--quota", "acme=cpu=4,memory=8Gi,gpu=1", "--max-running", "10", "--half-life", "5m")
	if code != exitOK {
		t.Fatalf("pool set src: exit %d, %s", code, errOut)
	}
	shown := sharing("src")
	want := "--weight acme=3 --weight beta=0.5 --quota acme=cpu=4,memory=8Gi,gpu=1 --quota beta=2 --max-running 10 --half-life 5m0s"
	if shown != want {
		t.Errorf("sharing: %q, want %q", shown, want)
	}
	code, _, errOut = fleetctl(t, append([]string{"--nats-url", url, "pool", "set", "dst"}, strings.Fields(shown)...)...)
	if code != exitOK {
		t.Fatalf("pool set dst %s: exit %d, %s", shown, code, errOut)
	}
	if src, dst := policy("src"), policy("dst"); src != dst {
		t.Errorf("pasted, the policy is %s, not %s", dst, src)
	}
	if s := sharing("dst"); s != shown {
		t.Errorf("pool show dst: %q, pool show src: %q", s, shown)
	}
}

// TestPoolShowCountsWhatAWorkerHoldsAsItsHelpSays: a job a worker has
// taken but not started (its not_before is to come; its pool is paused)
// counts as DELIVERED, not RUNNING, as pool's help says.
func TestPoolShowCountsWhatAWorkerHoldsAsItsHelpSays(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, noop.Executor{}, worker.Config{Pool: "later", Slots: 2})
	url := f.NATS.URL()
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	req := file(t, "job.json", `{"id": "later-1", "pool": "later", "command": ["true"], "not_before": "`+later+`"}`)
	if code, _, errOut := fleetctl(t, "--nats-url", url, "submit", "-f", req); code != exitOK {
		t.Fatalf("submit: exit %d, %s", code, errOut)
	}
	var s job.PoolState
	show := func() {
		t.Helper()
		code, out, errOut := fleetctl(t, "--nats-url", url, "-o", "json", "pool", "show", "later")
		if code != exitOK {
			t.Fatalf("pool show: exit %d, %s", code, errOut)
		}
		s = job.PoolState{}
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for show(); len(s.Tenants) != 1 || s.Tenants[0].Delivered != 1; show() {
		if time.Now().After(deadline) {
			t.Fatalf("the job the worker holds is not counted as delivered: %+v", s.Tenants)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _, errOut := fleetctl(t, "--nats-url", url, "pool", "pause", "later"); code != exitOK {
		t.Fatalf("pool pause: exit %d, %s", code, errOut)
	}
	show()
	if ts := s.Tenants; !s.Paused || len(ts) != 1 || ts[0].Delivered != 1 || ts[0].Queued != 0 || ts[0].Running != 0 {
		t.Errorf("paused: %v, tenants %+v; want the job delivered, not queued nor running", s.Paused, ts)
	}
	_, _, help := fleetctl(t, "pool", "--help")
	help = strings.Join(strings.Fields(help), " ")
	for _, want := range []string{"DELIVERED, those a worker has taken and not finished", "about to start",
		"a not_before", "a paused pool", "RUNNING, its attempts that run"} {
		if !strings.Contains(help, want) {
			t.Errorf("pool --help does not say %q of what pool show counts:\n%s", want, help)
		}
	}
}
