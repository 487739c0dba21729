package console

// The console's actions (cancel, retry) and its login.

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/queue"
)

// Actions.

func (c *Console) cancel(_ http.ResponseWriter, r *http.Request) (string, error) {
	k, err := jobKey(r.PathValue)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	reply, err := c.cfg.Cancel(ctx, k.Tenant, k.ID)
	if err != nil {
		return "", err
	}
	c.m.actions.Add(ctx, 1, metric.WithAttributes(attribute.String("action", "cancel")))
	c.log.Info("console: cancel", "tenant", k.Tenant, "pool", k.Pool, "job_id", k.ID, "cancelled", reply.Cancelled)
	return jobPath(k) + "?notice=" + url.QueryEscape(reply.Message), nil
}

// retry submits a tenant's dead letter again, and returns the new job.
func (c *Console) retry(ctx context.Context, k queue.JobKey) (queue.JobKey, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	reply, err := c.cfg.Retry(ctx, k.Tenant, k.ID)
	if err != nil {
		return queue.JobKey{}, err
	}
	if reply.Rejected() {
		return queue.JobKey{}, badRequest("the retry was rejected: " + reply.Error)
	}
	c.m.actions.Add(ctx, 1, metric.WithAttributes(attribute.String("action", "retry")))
	c.log.Info("console: retry of a dead letter", "tenant", k.Tenant, "job_id", k.ID, "new_job_id", reply.JobID)
	return queue.JobKey{Tenant: cmp.Or(reply.Tenant, k.Tenant), Pool: cmp.Or(reply.Pool, k.Pool), ID: reply.JobID}, nil
}

func (c *Console) retryOne(_ http.ResponseWriter, r *http.Request) (string, error) {
	k, err := jobKey(r.PathValue)
	if err != nil {
		return "", err
	}
	made, err := c.retry(r.Context(), k)
	if err != nil {
		return "", err
	}
	return jobPath(made) + "?notice=" + url.QueryEscape("retry of "+k.ID), nil
}

func (c *Console) retryMany(_ http.ResponseWriter, r *http.Request) (string, error) {
	refs := r.PostForm["job"]
	if len(refs) == 0 {
		return "", badRequest("no dead letter selected")
	}
	if len(refs) > 500 {
		return "", badRequest("at most 500 dead letters at once")
	}
	var made, failed []string
	for _, ref := range refs {
		// tenant/pool/id, as the page names each dead letter.
		parts := strings.SplitN(ref, "/", 3)
		if len(parts) != 3 {
			failed = append(failed, ref+" (not tenant/pool/id)")
			continue
		}
		k, err := parseKey(parts[0], parts[1], parts[2])
		if err == nil {
			var nk queue.JobKey
			if nk, err = c.retry(r.Context(), k); err == nil {
				made = append(made, nk.ID)
				continue
			}
		}
		failed = append(failed, ref+" ("+err.Error()+")")
	}
	msg := fmt.Sprintf("retried %d: %s", len(made), strings.Join(made, ", "))
	if len(failed) > 0 {
		msg += fmt.Sprintf("; %d failed: %s", len(failed), strings.Join(failed, "; "))
	}
	to := "/ui/dlq?notice=" + url.QueryEscape(msg)
	for _, name := range []string{"pool", "tenant"} {
		if v := r.PostFormValue(name); v != "" {
			to += "&" + name + "=" + url.QueryEscape(v)
		}
	}
	return to, nil
}

// Login.

type loginData struct {
	Next, Error string
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Auth == nil {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther) // an open console needs no login
		return
	}
	c.showLogin(w, r, "", http.StatusOK)
}

func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, msg string, code int) {
	v := c.newView("login", "Log in", who{})
	v.Data = &loginData{Next: safeNext(r.FormValue("next")), Error: msg}
	var buf bytes.Buffer
	if err := c.pages.render(&buf, "layout", v); err != nil {
		http.Error(w, "the page could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// safeNext keeps a redirect after login inside the console.
func safeNext(s string) string {
	if !strings.HasPrefix(s, "/ui/") || strings.HasPrefix(s, "//") || strings.ContainsAny(s, "\\\r\n") {
		return "/ui/"
	}
	return s
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		http.Error(w, "cross-site login refused", http.StatusForbidden)
		return
	}
	if c.cfg.Auth == nil {
		http.Redirect(w, r, safeNext(r.FormValue("next")), http.StatusSeeOther)
		return
	}
	id, key, ok := c.cfg.Auth.Token(strings.TrimSpace(r.PostFormValue("token")))
	if !ok {
		c.log.Warn("console: a login with a wrong token", "remote", r.RemoteAddr)
		c.showLogin(w, r, "That token is not accepted.", http.StatusUnauthorized)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: newSession(id, key, time.Now()), Path: "/ui/",
		MaxAge: int(sessionFor.Seconds()), HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/ui/", MaxAge: -1, HttpOnly: true, Secure: true,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}
