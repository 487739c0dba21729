package main

import (
	"strings"
	"testing"
	"time"
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
