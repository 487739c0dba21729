package console

// The console's actions (cancel, retry) and its login.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/job"
)

// Actions.

func (c *Console) cancel(_ http.ResponseWriter, r *http.Request) (string, error) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	reply, err := c.cfg.Cancel(ctx, job.DefaultTenant, id)
	if err != nil {
		return "", err
	}
	c.m.actions.Add(ctx, 1, metric.WithAttributes(attribute.String("action", "cancel")))
	c.log.Info("console: cancel", "job_id", id, "cancelled", reply.Cancelled)
	return "/ui/jobs/" + url.PathEscape(id) + "?notice=" + url.QueryEscape(reply.Message), nil
}

func (c *Console) retry(ctx context.Context, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	reply, err := c.cfg.Retry(ctx, job.DefaultTenant, id)
	if err != nil {
		return "", err
	}
	if reply.Rejected() {
		return "", badRequest("the retry was rejected: " + reply.Error)
	}
	c.m.actions.Add(ctx, 1, metric.WithAttributes(attribute.String("action", "retry")))
	c.log.Info("console: retry of a dead letter", "job_id", id, "new_job_id", reply.JobID)
	return reply.JobID, nil
}

func (c *Console) retryOne(_ http.ResponseWriter, r *http.Request) (string, error) {
	id := r.PathValue("id")
	newID, err := c.retry(r.Context(), id)
	if err != nil {
		return "", err
	}
	return "/ui/jobs/" + url.PathEscape(newID) + "?notice=" + url.QueryEscape("retry of "+id), nil
}

func (c *Console) retryMany(_ http.ResponseWriter, r *http.Request) (string, error) {
	ids := r.PostForm["job"]
	if len(ids) == 0 {
		return "", badRequest("no dead letter selected")
	}
	if len(ids) > 500 {
		return "", badRequest("at most 500 dead letters at once")
	}
	var made, failed []string
	for _, id := range ids {
		newID, err := c.retry(r.Context(), id)
		if err != nil {
			failed = append(failed, id+" ("+err.Error()+")")
			continue
		}
		made = append(made, newID)
	}
	msg := fmt.Sprintf("retried %d: %s", len(made), strings.Join(made, ", "))
	if len(failed) > 0 {
		msg += fmt.Sprintf("; %d failed: %s", len(failed), strings.Join(failed, "; "))
	}
	to := "/ui/dlq?notice=" + url.QueryEscape(msg)
	if p := r.PostFormValue("pool"); p != "" {
		to += "&pool=" + url.QueryEscape(p)
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
