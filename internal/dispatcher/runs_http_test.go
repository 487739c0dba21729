package dispatcher_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// runsAPI is the HTTP API of a fleet with a process worker, behind tokens:
// one of tenant acme's, one of an operator's.
type runsAPI struct {
	url        string
	acme, oper string
}

// do sends a request with token (none when ""), acting as tenant when it
// is given, and decodes the answer's body into v; it returns the status.
func (a runsAPI) do(t *testing.T, method, path, token, tenant, body string, v any) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if tenant != "" {
		req.Header.Set(dispatcher.TenantHeader, tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("%s %s: %s, and the body is not the answer: %v", method, path, resp.Status, err)
		}
	}
	return resp.StatusCode, resp.Header
}

// ended waits until the run ends and returns its view.
func (a runsAPI) ended(t *testing.T, token, id string) *job.RunView {
	t.Helper()
	var v job.RunView
	waitFor(t, 30*time.Second, "the end of run "+id, func() bool {
		v = job.RunView{}
		code, _ := a.do(t, http.MethodGet, "/v1/runs/"+id, token, "", "", &v)
		return code == http.StatusOK && v.State.Final()
	})
	return &v
}

// TestRunsOverHTTP: each route of the runs, as a tenant's token and as an
// operator's: a run submitted (201), again (200, a duplicate), refused
// (400, every problem naming its node and field), shown, listed,
// cancelled, retried (409 while it runs, 200 once it ended); a run
// another tenant has, or none has, is 404; a tenant's token acts as its
// tenant alone.
func TestRunsOverHTTP(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	exec, err := process.New(process.Config{Dir: t.TempDir(), Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, exec, worker.Config{Slots: 4, RunningAfter: 20 * time.Millisecond})
	tokens := filepath.Join(t.TempDir(), "tokens")
	a := runsAPI{acme: "acme-token-0123456789", oper: "operator-token-0123456789"}
	if err := os.WriteFile(tokens, []byte(a.acme+" acme\n"+a.oper+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var auth dispatcher.Auth
	if err := auth.LoadTokens(tokens); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(auth.Wrap(dispatcher.NewAPI(f.Dispatcher)))
	t.Cleanup(srv.Close)
	a.url = srv.URL

	const failing = `{"id": "r1", "labels": {"team": "data"}, "nodes": [
		{"id": "a", "job": {"command": ["true"]}},
		{"id": "b", "after": ["a"], "job": {"command": ["sh", "-c", "exit 3"], "retry": {"max_attempts": 1}}},
		{"id": "c", "after": ["b"], "job": {"command": ["true"]}}]}`

	// Submitted as acme, and again.
	var sub job.RunSubmitReply
	code, h := a.do(t, http.MethodPost, "/v1/runs", a.acme, "", failing, &sub)
	if code != http.StatusCreated || sub.RunID != "r1" || sub.Tenant != "acme" || sub.Nodes != 3 || sub.State != job.RunRunning ||
		sub.Duplicate || h.Get("Location") != "/v1/runs/r1" {
		t.Fatalf("POST /v1/runs: %d %+v, Location %q", code, sub, h.Get("Location"))
	}
	sub = job.RunSubmitReply{}
	if code, _ := a.do(t, http.MethodPost, "/v1/runs", a.acme, "", failing, &sub); code != http.StatusOK || !sub.Duplicate || sub.RunID != "r1" {
		t.Errorf("POST /v1/runs again: %d %+v; want 200, a duplicate", code, sub)
	}
	// The same id is another run in another tenant: the operator's token
	// acts as default without the header.
	sub = job.RunSubmitReply{}
	if code, _ := a.do(t, http.MethodPost, "/v1/runs", a.oper, "", `{"id": "r1", "nodes": [{"id": "only", "job": {"command": ["true"]}}]}`, &sub); code != http.StatusCreated ||
		sub.Duplicate || sub.Tenant != job.DefaultTenant || sub.Nodes != 1 {
		t.Errorf("POST /v1/runs of default's r1: %d %+v; want 201, default's own", code, sub)
	}

	// Refused whole, every problem named, and not kept.
	var refused job.RunSubmitReply
	code, _ = a.do(t, http.MethodPost, "/v1/runs", a.acme, "", `{"id": "bad", "nodes": [
		{"id": "a", "after": ["nosuch"], "job": {"command": ["true"]}},
		{"id": "b", "when": "sometimes", "job": {"command": ["true"], "priority": 9}}]}`, &refused)
	want := []string{`nodes[0] (a).after: "nosuch" is not a node of the run`, `nodes[1] (b).when: "sometimes" is not a rule`, `nodes[1] (b).job.priority`}
	if code != http.StatusBadRequest || refused.Error == "" || len(refused.Problems) != len(want) {
		t.Fatalf("POST a bad run: %d %+v; want 400 with %d problems", code, refused, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(refused.Problems[i], w) {
			t.Errorf("problem %d: %q; want it to start %q", i, refused.Problems[i], w)
		}
	}
	refused = job.RunSubmitReply{}
	if code, _ := a.do(t, http.MethodPost, "/v1/runs", a.acme, "", `{"nodes": [], "extra": 1}`, &refused); code != http.StatusBadRequest ||
		len(refused.Problems) != 1 || !strings.Contains(refused.Problems[0], `unknown field "extra"`) {
		t.Errorf("POST a run with an unknown field: %d %+v", code, refused)
	}
	var e job.ErrorReply
	if code, _ := a.do(t, http.MethodGet, "/v1/runs/bad", a.acme, "", "", &e); code != http.StatusNotFound || !e.NotFound {
		t.Errorf("GET a refused run: %d %+v; want 404", code, e)
	}
	refused = job.RunSubmitReply{}
	big := `{"nodes": [{"id": "a", "job": {"command": ["` + strings.Repeat("x", int(f.NC.MaxPayload())) + `"]}}]}`
	if code, _ := a.do(t, http.MethodPost, "/v1/runs", a.acme, "", big, &refused); code != http.StatusRequestEntityTooLarge ||
		!strings.Contains(refused.Error, "over the limit") {
		t.Errorf("POST a run over the server's max payload: %d %+v; want 413", code, refused)
	}

	// Shown as it ends: a succeeded, b failed, c never ran.
	v := a.ended(t, a.acme, "r1")
	states := map[string]string{}
	for _, n := range v.Nodes {
		states[n.ID] = string(n.State) + "/" + string(n.Code) + "/" + n.JobID
	}
	if v.State != job.RunFailed || v.Tenant != "acme" || v.Round != 1 || v.Labels["team"] != "data" ||
		states["a"] != "succeeded//r1:a" || states["b"] != "failed/exit_code/r1:b" || states["c"] != "cancelled/upstream_failed/r1:c" {
		t.Errorf("GET /v1/runs/r1: %s round %d, tenant %s, labels %v, nodes %v", v.State, v.Round, v.Tenant, v.Labels, states)
	}

	// Retried once it ended: b and what comes after it, as round 2.
	var rr job.RunReply
	if code, _ := a.do(t, http.MethodPost, "/v1/runs/r1/retry", a.acme, "", "", &rr); code != http.StatusOK || rr.Round != 2 ||
		!slices.Equal(rr.Retried, []string{"b", "c"}) {
		t.Errorf("POST /v1/runs/r1/retry: %d %+v; want round 2 running b and c", code, rr)
	}
	if v := a.ended(t, a.acme, "r1"); v.Round != 2 || v.State != job.RunFailed {
		t.Errorf("round 2 of r1: %s round %d", v.State, v.Round)
	}

	// A run that has not ended is not retried: the answer says what to
	// do. Cancelled, it ends, and may be.
	sub = job.RunSubmitReply{}
	if code, _ := a.do(t, http.MethodPost, "/v1/runs", a.acme, "", `{"id": "slow", "nodes": [
		{"id": "sleep", "job": {"command": ["sleep", "60"]}},
		{"id": "after", "after": ["sleep"], "job": {"command": ["true"]}}]}`, &sub); code != http.StatusCreated {
		t.Fatalf("POST the slow run: %d %+v", code, sub)
	}
	e = job.ErrorReply{}
	if code, _ := a.do(t, http.MethodPost, "/v1/runs/slow/retry", a.acme, "", "", &e); code != http.StatusConflict ||
		!strings.Contains(e.Error, "run slow has not ended (round 1 is running): cancel it first (POST /v1/runs/slow/cancel)") {
		t.Errorf("POST /v1/runs/slow/retry while it runs: %d %+v; want 409 saying to cancel it first", code, e)
	}
	rr = job.RunReply{}
	if code, _ := a.do(t, http.MethodPost, "/v1/runs/slow/cancel", a.acme, "", "", &rr); code != http.StatusOK || !rr.Cancelled || rr.Round != 1 {
		t.Errorf("POST /v1/runs/slow/cancel: %d %+v", code, rr)
	}
	if v := a.ended(t, a.acme, "slow"); v.State != job.RunCancelled || !v.CancelRequested {
		t.Errorf("slow after its cancel: %s, cancel requested %v", v.State, v.CancelRequested)
	}
	rr = job.RunReply{}
	if code, _ := a.do(t, http.MethodPost, "/v1/runs/slow/cancel", a.acme, "", "", &rr); code != http.StatusOK || rr.Cancelled ||
		!strings.Contains(rr.Message, "nothing to cancel: the run has ended (cancelled)") {
		t.Errorf("POST /v1/runs/slow/cancel again: %d %+v", code, rr)
	}

	// Listed, each tenant its own.
	var list job.RunList
	if code, _ := a.do(t, http.MethodGet, "/v1/runs", a.acme, "", "", &list); code != http.StatusOK || !slices.Equal(list.Runs, []string{"r1", "slow"}) {
		t.Errorf("GET /v1/runs as acme: %d %v; want r1 slow", code, list.Runs)
	}
	list = job.RunList{}
	if code, _ := a.do(t, http.MethodGet, "/v1/runs", a.oper, "", "", &list); code != http.StatusOK || !slices.Equal(list.Runs, []string{"r1"}) {
		t.Errorf("GET /v1/runs as default: %d %v; want r1", code, list.Runs)
	}
	list = job.RunList{}
	if code, _ := a.do(t, http.MethodGet, "/v1/runs", a.oper, "nobody", "", &list); code != http.StatusOK || list.Runs == nil || len(list.Runs) != 0 {
		t.Errorf("GET /v1/runs of a tenant without runs: %d %#v; want 200 and an empty list", code, list.Runs)
	}

	// A tenant's token reaches its tenant's runs alone; an operator's
	// reaches any tenant's, by the header.
	for _, c := range []struct {
		method, path, token, tenant string
		want                        int
	}{
		{http.MethodGet, "/v1/runs/slow", "", "", http.StatusUnauthorized},
		{http.MethodGet, "/v1/runs", "", "", http.StatusUnauthorized},
		{http.MethodPost, "/v1/runs/slow/cancel", "not-a-token-of-this-fleet", "", http.StatusUnauthorized},
		{http.MethodGet, "/v1/runs/slow", a.acme, "default", http.StatusForbidden},
		{http.MethodGet, "/v1/runs", a.acme, "default", http.StatusForbidden},
		{http.MethodPost, "/v1/runs", a.acme, "default", http.StatusForbidden},
		{http.MethodPost, "/v1/runs/r1/retry", a.acme, "default", http.StatusForbidden},
		{http.MethodGet, "/v1/runs/slow", a.acme, "acme", http.StatusOK},
		{http.MethodGet, "/v1/runs/slow", a.oper, "", http.StatusNotFound}, // default has no run slow
		{http.MethodGet, "/v1/runs/slow", a.oper, "acme", http.StatusOK},
		{http.MethodPost, "/v1/runs/slow/cancel", a.oper, "", http.StatusNotFound},
		{http.MethodPost, "/v1/runs/slow/retry", a.oper, "", http.StatusNotFound},
		{http.MethodGet, "/v1/runs/nosuch", a.acme, "", http.StatusNotFound},
		{http.MethodPost, "/v1/runs/nosuch/cancel", a.acme, "", http.StatusNotFound},
		{http.MethodPost, "/v1/runs/nosuch/retry", a.acme, "", http.StatusNotFound},
		{http.MethodGet, "/v1/runs/not%20a%20run", a.acme, "", http.StatusNotFound},
		{http.MethodGet, "/v1/runs", a.oper, "not a tenant", http.StatusBadRequest},
	} {
		var body bytes.Buffer
		if c.method == http.MethodPost && c.path == "/v1/runs" {
			body.WriteString(`{"nodes": [{"id": "a", "job": {"command": ["true"]}}]}`)
		}
		if code, _ := a.do(t, c.method, c.path, c.token, c.tenant, body.String(), nil); code != c.want {
			t.Errorf("%s %s with token %q as %q: %d, want %d", c.method, c.path, c.token, c.tenant, code, c.want)
		}
	}
	// The operator's, as acme, sees acme's run.
	v = &job.RunView{}
	if code, _ := a.do(t, http.MethodGet, "/v1/runs/r1", a.oper, "acme", "", v); code != http.StatusOK || v.Tenant != "acme" || len(v.Nodes) != 3 {
		t.Errorf("GET acme's r1 as an operator: %d %+v", code, v)
	}
}
