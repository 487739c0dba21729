package console

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/internal/lifecycle"
)

// Rates a page may ask its updates at.
const (
	minEvery     = 500 * time.Millisecond
	defaultEvery = time.Second
	maxEvery     = time.Minute
)

// stream serves a page's live part as server-sent events: an event
// "page" with the part's HTML whenever what it shows changed, at most at
// the rate the page asks (every=1s), and at least every few seconds while
// it shows ages. A comment keeps idle connections open.
func (c *Console) stream(w http.ResponseWriter, r *http.Request, v who) {
	q := r.URL.Query()
	every := defaultEvery
	if e := q.Get("every"); e != "" {
		d, err := time.ParseDuration(e)
		if err != nil {
			http.Error(w, "every: a duration such as 1s", http.StatusBadRequest)
			return
		}
		every = min(max(d, minEvery), maxEvery)
	}
	name := q.Get("page")
	var build builder
	var changed func() uint64
	ctx := r.Context()
	switch name {
	case "overview":
		build = c.overview
		changed = func() uint64 { return c.index.Version() + c.workVersion() }
	case "jobs":
		build = c.jobs
		changed = c.index.Version
	case "workers":
		build = c.workersPage
		changed = c.workVersion
	case "dlq":
		build = c.dlqPage
		changed = func() uint64 { return c.dead.versionOf() + c.index.Version() }
	case "schedules":
		build = c.schedulesPage
		changed = func() uint64 { return c.sched.changed() + c.index.Version() }
	case "pools":
		build = c.poolsPage
		changed = c.pools.changed
	case "runs", "run":
		// What the page shows is worked out to tell whether it changed,
		// and drawn from that if it did: one read a step.
		var last any
		var lastErr error
		read := func(ctx context.Context) (any, uint64, error) {
			if name == "runs" {
				d, err := c.runsData(ctx, q)
				if err != nil {
					return nil, 0, err
				}
				return d, d.sum, nil
			}
			d, err := c.runData(ctx, q.Get("tenant"), q.Get("id"))
			if err != nil {
				return nil, 0, err
			}
			return d, d.sum, nil
		}
		// A run that cannot be shown is refused now, as its page was.
		if _, _, err := read(ctx); err != nil {
			c.fail(w, err)
			return
		}
		var failures uint64
		changed = func() uint64 {
			var sum uint64
			last, sum, lastErr = read(ctx)
			if lastErr != nil {
				failures++ // the build reports it
				return failures
			}
			return sum
		}
		build = func(_ context.Context, _ *http.Request, vw *view) error {
			if lastErr != nil {
				return lastErr
			}
			if d, ok := last.(*runData); ok {
				c.fillRun(d, vw)
				return nil
			}
			vw.Data = last
			return nil
		}
	case "job":
		k, err := jobKey(q.Get)
		if err != nil {
			c.fail(w, err)
			return
		}
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		fl, err := c.openJob(octx, k, true)
		cancel()
		if err != nil {
			c.fail(w, err)
			return
		}
		defer fl.close()
		build = func(_ context.Context, _ *http.Request, vw *view) error {
			c.fillJob(fl, vw)
			return nil
		}
		changed = fl.changed
	default:
		http.Error(w, "page: one of overview, jobs, job, runs, run, workers, dlq, schedules, pools", http.StatusBadRequest)
		return
	}
	rc := http.NewResponseController(w)
	// The server's read timeout would end the stream too: once it passes,
	// the server takes the connection for closed.
	_ = rc.SetReadDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	c.m.streams.Add(ctx, 1)
	defer c.m.streams.Add(context.WithoutCancel(ctx), -1)

	// The stream ends with the request, or when the console ends its
	// streams (a graceful shutdown).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	last, sent := ^uint64(0), time.Time{}
	refresh := max(5*time.Second, every) // ages move even when nothing else does
	var buf bytes.Buffer
	// step sends what changed; false ends the stream.
	step := func(ctx context.Context) bool {
		now := time.Now()
		ver := changed()
		if ver != last || now.Sub(sent) >= refresh {
			vw := c.newView(name, "", v)
			if err := build(ctx, r, vw); err != nil {
				if ctx.Err() != nil {
					return false
				}
				c.log.Debug("console stream", "page", name, "err", err)
				return true
			}
			buf.Reset()
			if err := c.pages.render(&buf, name, vw); err != nil {
				c.log.Error("console stream page", "page", name, "err", err)
				return false
			}
			if err := c.send(rc, w, "page", buf.Bytes(), every); err != nil {
				return false
			}
			last, sent = ver, now
		} else if now.Sub(sent) >= 15*time.Second {
			_ = rc.SetWriteDeadline(time.Now().Add(every + 10*time.Second))
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return false
			}
			sent = now
		}
		return true
	}
	// The first update comes at once: the page was drawn before the stream
	// opened, and may be a moment old.
	if !step(ctx) {
		return
	}
	lifecycle.Tick(ctx, every, func(ctx context.Context) {
		if !step(ctx) {
			cancel()
		}
	})
}

// send writes one event, its data split in lines as the format wants.
func (c *Console) send(rc *http.ResponseController, w http.ResponseWriter, event string, data []byte, every time.Duration) error {
	// The server's write timeout would end the stream: each write gets its
	// own deadline.
	_ = rc.SetWriteDeadline(time.Now().Add(every + 10*time.Second))
	var b strings.Builder
	b.Grow(len(data) + 64)
	b.WriteString("event: ")
	b.WriteString(event)
	b.WriteByte('\n')
	for _, line := range bytes.Split(data, []byte("\n")) {
		b.WriteString("data: ")
		b.Write(bytes.TrimRight(line, "\r"))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	if _, err := w.Write([]byte(b.String())); err != nil {
		return err
	}
	return rc.Flush()
}

func (c *Console) workVersion() uint64 {
	c.work.mu.RLock()
	defer c.work.mu.RUnlock()
	return c.work.version
}

func (d *deadLetters) versionOf() uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.version
}
