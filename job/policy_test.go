package job_test

import (
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

func TestParseQuota(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want job.Quota
		err  bool
	}{
		{"2", job.Quota{Slots: 2}, false},
		{"gpu=2", job.Quota{GPU: 2}, false},
		{"cpu=4,memory=8Gi,gpu=1", job.Quota{CPU: "4", Memory: "8Gi", GPU: 1}, false},
		{"slots=3, cpu=500m", job.Quota{Slots: 3, CPU: "500m"}, false},
		{"none", job.Quota{}, false},
		{"-1", job.Quota{}, true},
		{"cpu=lots", job.Quota{}, true},
		{"disk=1", job.Quota{}, true},
		{"gpu", job.Quota{}, true},
	} {
		got, err := job.ParseQuota(tc.in)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("ParseQuota(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	if l := (job.Quota{CPU: "4", Memory: "1Gi", GPU: 2}).Limits(); l.CPUMilli != 4000 || l.MemoryBytes != 1<<30 || l.GPUs != 2 || l.Slots != -1 {
		t.Errorf("limits: %+v", l)
	}
	if s := (job.Quota{Slots: 2, GPU: 1}).String(); s != "slots=2,gpu=1" {
		t.Errorf("String: %q", s)
	}
}

func TestPolicyChangeMergesAndRemoves(t *testing.T) {
	two, zero := 2, 0
	hl := job.Duration(time.Minute)
	p := (&job.PolicyChange{Weights: map[string]float64{"a": 1, "b": 3}, Quotas: map[string]job.Quota{"c": {Slots: 2}},
		MaxRunning: &two, HalfLife: &hl}).Apply(nil)
	if p.Weight("b") != 3 || p.Weight("z") != job.DefaultWeight || p.Quota("c").Slots != 2 || p.MaxRunning != 2 || p.HalfLifeOr() != time.Minute {
		t.Fatalf("applied: %+v", p)
	}
	q := (&job.PolicyChange{Weights: map[string]float64{"a": 0}, Quotas: map[string]job.Quota{"c": {}}, MaxRunning: &zero}).Apply(p)
	if _, ok := q.Weights["a"]; ok || q.Weights["b"] != 3 || q.Quotas != nil || q.MaxRunning != 0 {
		t.Fatalf("after removing: %+v", q)
	}
	if p.Weights["a"] != 1 || p.Quotas["c"].Slots != 2 {
		t.Fatal("Apply changed the policy it was given")
	}
	bad := []job.PolicyChange{
		{Weights: map[string]float64{"a.b": 1}},
		{Weights: map[string]float64{"a": -1}},
		{Quotas: map[string]job.Quota{"a": {CPU: "x"}}},
		{HalfLife: func() *job.Duration { d := job.Duration(time.Millisecond); return &d }()},
	}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v was accepted", c)
		}
	}
}
