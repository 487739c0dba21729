package e2e

import (
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/job"
)

// TestDispatcherServesTheConsole runs the dispatcher binary with the
// console's flags: a token to log in with, read-only, trace links; and
// with --console=false.
func TestDispatcherServesTheConsole(t *testing.T) {
	f := fleettest.Start(t)
	const token = "console-e2e-token-0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	d := fleettest.StartProc(t, "dispatcher", []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL="},
		"--http-addr", addr, "--api-token-file", tokens, "--console-read-only", "--trace-url", "https://jaeger.example/trace/{trace_id}")
	d.WaitOutput(t, "console index ready", 20*time.Second)
	id := f.Submit(t, &job.Request{ID: "console-e2e", Command: []string{"true"}})
	base := "http://" + addr
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Timeout: 5 * time.Second, Jar: jar}

	resp, err := c.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Path != "/ui/login" {
		t.Fatalf("/ without a token ends at %s, want the login form", resp.Request.URL)
	}
	// Go's cookie jar keeps Secure cookies only for https: log in by hand.
	noRedirect := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noRedirect.PostForm(base+"/ui/login", url.Values{"token": {token}, "next": {"/ui/jobs"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "fleet_session" {
			session = ck
		}
	}
	if resp.StatusCode != http.StatusSeeOther || session == nil || !session.HttpOnly || !session.Secure || session.SameSite != http.SameSiteStrictMode {
		t.Fatalf("login: %d, cookie %+v", resp.StatusCode, session)
	}
	get := func(path string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.AddCookie(session)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
		return resp.StatusCode, b.String()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, page := get("/ui/jobs")
		if code == http.StatusOK && strings.Contains(page, `id="job-default.default.`+id+`"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the console does not list %s: %d", id, code)
		}
		time.Sleep(100 * time.Millisecond)
	}
	code, page := get("/ui/jobs/default/default/" + id)
	if code != http.StatusOK || strings.Contains(page, `id="cancel"`) || !strings.Contains(page, "read-only") {
		t.Errorf("the read-only job page: %d, a cancel button or no read-only mark", code)
	}
	if strings.Contains(page, token) {
		t.Error("the token is in a page")
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	form := url.Values{"csrf": {"none"}}
	if csrf != nil {
		form.Set("csrf", csrf[1])
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/ui/jobs/default/default/"+id+"/cancel", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(session)
	if resp, err = noRedirect.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cancel on a read-only console: %d, want 403", resp.StatusCode)
	}
	if strings.Contains(d.Output(), token) {
		t.Error("the token is in the dispatcher's log")
	}

	off := freeAddr(t)
	d2 := fleettest.StartProc(t, "dispatcher", []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL="},
		"--http-addr", off, "--console=false")
	d2.WaitOutput(t, "dispatcher ready", 20*time.Second)
	if got := get2(t, "http://"+off+"/ui/"); got != http.StatusNotFound {
		t.Errorf("/ui/ with --console=false: %d, want 404", got)
	}
}

func get2(t *testing.T, u string) int {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
