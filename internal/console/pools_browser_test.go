package console_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// TestConsolePoolsPageShowsHowTenantsFare: a paused pool shared by
// weights, with jobs of two tenants queued at two priorities, is shown
// with its policy, and a row per tenant with its weight, quota, what it
// has queued by priority and the share its weight gives it; when the pool
// is resumed and a worker runs the jobs, the page follows live.
func TestConsolePoolsPageShowsHowTenantsFare(t *testing.T) {
	s := startSite(t, siteOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.f.Client.PausePool(ctx, "default", "sharing test"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.f.Client.SetPoolPolicy(ctx, "default", &job.PolicyChange{Weights: map[string]float64{"acme": 3},
		Quotas: map[string]job.Quota{"beta": {Slots: 2}}}); err != nil {
		t.Fatal(err)
	}
	acme, beta := tenantClient(t, s, "acme"), tenantClient(t, s, "beta")
	for i := range 3 {
		if _, err := acme.Submit(ctx, &job.Request{ID: fmt.Sprintf("a-%d", i), Priority: 1, Command: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := beta.Submit(ctx, &job.Request{ID: "b-0", Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	b.open(t, s.url("/ui/pools"))
	if b.attr(t, "#nav-pools", "aria-current") != "page" {
		t.Error("the nav does not mark the pools page")
	}
	acmeRow, betaRow := `#pool-default tr[data-tenant="acme"]`, `#pool-default tr[data-tenant="beta"]`
	waitFor(t, "both tenants' rows", 10*time.Second, func() bool { return b.exists(t, acmeRow) && b.exists(t, betaRow) })
	if h := b.text(t, "#pool-default h2"); !strings.Contains(h, "paused") || !strings.Contains(h, "weights acme=3") ||
		!strings.Contains(h, "quotas beta=slots=2") {
		t.Errorf("the pool's heading: %q", h)
	}
	for sel, want := range map[string]string{
		acmeRow + " td.weight": "3", acmeRow + " td.queued": "3", acmeRow + " td.by-priority": "p1 3", acmeRow + " td.fair": "75%",
		betaRow + " td.weight": "1", betaRow + " td.queued": "1", betaRow + " td.quota": "slots=2", betaRow + " td.fair": "25%",
	} {
		if got := b.text(t, sel); got != want {
			t.Errorf("%s: %q, want %q", sel, got, want)
		}
	}
	// Resumed, with a worker: the jobs run, and the page follows.
	s.worker(t, "w-pools")
	if _, err := s.f.Client.ResumePool(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the page live, resumed and drained", 20*time.Second, func() bool {
		return strings.Contains(b.text(t, "#pool-default h2"), "running") &&
			(!b.exists(t, acmeRow) || b.text(t, acmeRow+" td.queued") == "0")
	})
}
