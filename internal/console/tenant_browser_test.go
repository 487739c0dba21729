package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/job"
)

// tenantClient is a producer of tenant on the site's fleet.
func tenantClient(t *testing.T, s *site, tenant string) *client.Client {
	t.Helper()
	c, err := client.New(s.f.NATS.Connect(t), client.WithTenant(tenant))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func submitAs(t *testing.T, c *client.Client, r *job.Request) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := c.Submit(ctx, r)
	if err != nil {
		t.Fatalf("submit as %s: %v", c.Tenant(), err)
	}
	return sub.JobID
}

func awaitAs(t *testing.T, c *client.Client, id string, within time.Duration) *job.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	r, err := c.Result(ctx, id)
	if err != nil {
		t.Fatalf("result of %s's %s: %v", c.Tenant(), id, err)
	}
	return r
}

// TestConsoleFiltersByTenantAndShowsAnotherTenantsJob: jobs of two
// tenants with the same id are two rows; the tenant filter lists one
// tenant's only; the page of a job of a tenant other than the default
// (/ui/jobs/<tenant>/<pool>/<id>) shows that job, not the other tenant's
// of the same id: its request with env names only, its events, its log,
// its result; cancel stops a running job of that tenant, and retry makes
// a new job of that tenant from its dead letter. The old /ui/jobs/<id>
// leads to the default tenant's job.
func TestConsoleFiltersByTenantAndShowsAnotherTenantsJob(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-tenants")
	acme := tenantClient(t, s, "acme")
	def := tenantClient(t, s, job.DefaultTenant)
	id := submitAs(t, acme, &job.Request{ID: "same-id", Command: []string{"sh", "-c", "echo hello from acme; echo warned >&2"},
		Env: map[string]string{"ACME_TOKEN": "acme-secret-value"}, Labels: map[string]string{"team": "a"}})
	submitAs(t, def, &job.Request{ID: "same-id", Command: []string{"sh", "-c", "echo hello from default"}})
	if r := awaitAs(t, acme, id, 15*time.Second); r.Status != job.StatusSucceeded {
		t.Fatalf("acme's job ended %s", r.Status)
	}
	awaitAs(t, def, id, 15*time.Second)
	sleepy := submitAs(t, acme, &job.Request{ID: "acme-sleepy", Command: []string{"sleep", "60"}})

	b := newBrowser(t)
	b.open(t, s.url("/ui/jobs"))
	waitFor(t, "both tenants' rows", 10*time.Second, func() bool {
		return b.exists(t, row("acme", "default", id)) && b.exists(t, row("default", "default", id)) &&
			b.exists(t, row("acme", "default", sleepy))
	})
	if got := b.text(t, row("acme", "default", id)+" td.tenant"); got != "acme" {
		t.Errorf("the tenant column of acme's row: %q", got)
	}
	b.do(t, chromedp.SetValue(chromedp.ID("f-tenant"), "acme"), chromedp.Click(chromedp.ID("f-apply")))
	waitFor(t, "the filtered list", 10*time.Second, func() bool { return strings.Contains(b.location(t), "tenant=acme") })
	b.do(t, chromedp.WaitVisible(chromedp.CSS(row("acme", "default", id))))
	if b.exists(t, row("default", "default", id)) || b.text(t, "#total") != "2" {
		t.Errorf("tenant=acme: the default tenant's job listed, or total %q (want 2)", b.text(t, "#total"))
	}
	b.open(t, s.url("/ui/jobs?tenant=default&id=same-id"))
	if !b.exists(t, row("default", "default", id)) || b.exists(t, row("acme", "default", id)) {
		t.Error("tenant=default, id=same-id: not exactly the default tenant's job")
	}

	// acme's job: its page, from its row.
	b.open(t, s.url("/ui/jobs?tenant=acme"))
	b.click(t, row("acme", "default", id)+" td.id a")
	b.do(t, chromedp.WaitVisible(chromedp.ID("tenant")))
	if loc := strings.SplitN(b.location(t), "?", 2)[0]; !strings.HasSuffix(loc, jobPage("acme", "default", id)) {
		t.Errorf("acme's row leads to %s", loc)
	}
	waitFor(t, "the page live", 5*time.Second, func() bool { return strings.HasPrefix(b.text(t, "#status"), "live") })
	html := eval[string](t, b, `document.documentElement.outerHTML`)
	switch {
	case b.text(t, "#tenant") != "acme":
		t.Errorf("the page names tenant %q", b.text(t, "#tenant"))
	case !strings.Contains(b.text(t, "#stdout"), "hello from acme") || !strings.Contains(b.text(t, "#log"), "hello from acme"):
		t.Errorf("the result or the log is not acme's job's: stdout %q, log %q", b.text(t, "#stdout"), b.text(t, "#log"))
	case strings.Contains(html, "hello from default"):
		t.Error("acme's page shows the default tenant's job of the same id")
	case strings.Contains(html, "acme-secret-value") || !strings.Contains(html, "ACME_TOKEN"):
		t.Error("the page shows an env value, or not the env's names")
	}
	for _, ev := range []string{"queued", "started", "succeeded"} {
		if !b.exists(t, "ol.events li.e-"+ev) {
			t.Errorf("no %s event in the timeline", ev)
		}
	}
	b.visitAll(t, s, jobPage("acme", "default", id))
	// /ui/jobs/<id> is the default tenant's.
	b.open(t, s.url("/ui/jobs/"+id))
	if loc := b.location(t); !strings.HasSuffix(loc, jobPage("default", "default", id)) || b.text(t, "#tenant") != "default" {
		t.Errorf("/ui/jobs/%s led to %s (tenant %q)", id, loc, b.text(t, "#tenant"))
	}

	// Cancel, as acme.
	b.open(t, s.url(jobPage("acme", "default", sleepy)))
	waitFor(t, "running on the page", 10*time.Second, func() bool { return b.exists(t, "h1 .s-running") })
	eval[bool](t, b, `window.confirm = function () { return true }; true`)
	b.click(t, "#cancel")
	waitFor(t, "cancelled on the page", 15*time.Second, func() bool { return b.exists(t, "h1 .s-cancelled") })
	if r := awaitAs(t, acme, sleepy, 10*time.Second); r.Status != job.StatusCancelled {
		t.Errorf("acme's sleepy job ended %s", r.Status)
	}

	// Retry a dead letter, as acme.
	doomed := submitAs(t, acme, &job.Request{ID: "acme-doomed", Command: []string{"sh", "-c", "exit 3"}})
	if r := awaitAs(t, acme, doomed, 15*time.Second); r.Status != job.StatusFailed {
		t.Fatalf("acme's doomed job ended %s", r.Status)
	}
	b.open(t, s.url("/ui/dlq?tenant=acme"))
	dl := deadRow("acme", "default", doomed)
	waitFor(t, "acme's dead letter", 10*time.Second, func() bool { return b.exists(t, dl) })
	if got := b.text(t, dl+" td.tenant"); got != "acme" {
		t.Errorf("the dead letter's tenant: %q", got)
	}
	b.click(t, `button[data-retry="acme/default/`+doomed+`"]`)
	want := job.RetryID(doomed, 1)
	waitFor(t, "the retry's page", 10*time.Second, func() bool {
		return strings.HasSuffix(strings.SplitN(b.location(t), "?", 2)[0], jobPage("acme", "default", want))
	})
	if r := awaitAs(t, acme, want, 15*time.Second); r.Status != job.StatusFailed {
		t.Errorf("acme's %s ended %s, want failed as its request says", want, r.Status)
	}
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}
