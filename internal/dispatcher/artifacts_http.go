package dispatcher

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The API's routes to a job's files, streamed from the object store:
//
//	GET /v1/jobs/{id}/outputs/{name...}          a declared output's bytes
//	GET /v1/jobs/{id}/logs[?attempt=N][&follow=true]   an attempt's log
//
// An output comes with its Content-Length and digest (ETag, Repr-Digest
// and Digest headers, all of its SHA-256), and is checked against the
// result's digest as it is sent: if the stored bytes differ, the response
// is cut short, so that a client never takes wrong bytes for whole ones.
// A finished attempt's log is sent the same way; a running attempt's, and
// a followed one's, is sent as it is stored, without a length.

func (a *API) serveArtifacts() {
	a.mux.HandleFunc("GET /v1/jobs/{id}/outputs/{name...}", a.output)
	a.mux.HandleFunc("GET /v1/jobs/{id}/logs", a.logs)
}

func (a *API) artifactStore() *artifact.Store {
	a.artsOnce.Do(func() { a.arts = artifact.New(a.d.js, artifact.Config{Names: a.d.names}) })
	return a.arts
}

func (a *API) output(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id, name := r.PathValue("id"), r.PathValue("name")
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	st, err := a.d.Status(ctx, tenant, id)
	if err != nil {
		a.fail(w, err)
		return
	}
	if st.Result == nil {
		writeJSON(w, http.StatusConflict, &job.ErrorReply{
			Error: fmt.Sprintf("job %s has not finished (it is %s): its outputs come with its result", id, st.Job.State)})
		return
	}
	o, err := artifact.OpenOutput(ctx, a.artifactStore(), st.Result, name)
	if err != nil {
		a.failFile(w, err)
		return
	}
	defer o.Close()
	h := w.Header()
	h.Set("Content-Type", contentType(o.ContentType))
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", path.Base(name)))
	setDigest(h, o.Size, o.SHA256)
	a.stream(w, r, o, false)
}

func (a *API) logs(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	q := r.URL.Query()
	attempt := 0
	if v := q.Get("attempt"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeJSON(w, http.StatusBadRequest, &job.ErrorReply{Error: fmt.Sprintf("attempt %q: attempts count from 1", v)})
			return
		}
		attempt = n
	}
	follow := false
	if v := q.Get("follow"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, &job.ErrorReply{Error: fmt.Sprintf("follow %q: true or false", v)})
			return
		}
		follow = b
	}
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	rec, _, err := a.d.find(ctx, tenant, id)
	if err != nil {
		a.fail(w, err)
		return
	}
	if attempt > rec.Attempt && !follow {
		writeJSON(w, http.StatusNotFound, &job.ErrorReply{Error: fmt.Sprintf("job %s has had %d attempts, not %d", id, rec.Attempt, attempt), NotFound: true})
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	if !follow {
		// One attempt's log, whole if it has ended.
		n := attempt
		if n == 0 {
			n = max(rec.Attempt, 1)
		}
		h.Set("X-Fleet-Attempt", strconv.Itoa(n))
		lr, err := a.artifactStore().OpenLog(ctx, queue.Key(rec), n, artifact.ReadLogOptions{})
		if err != nil {
			a.failFile(w, err)
			return
		}
		defer lr.Close()
		if info := lr.Info(); info != nil {
			setDigest(h, info.Size, info.SHA256)
		}
		a.stream(w, r, lr, false)
		return
	}
	k := queue.Key(rec)
	latest := func(ctx context.Context) (*job.Record, error) {
		rec, _, err := a.d.jobs.Latest(ctx, k)
		return rec, err
	}
	lr := artifact.OpenJobLog(ctx, a.artifactStore(), latest, id, artifact.JobLogOptions{Attempt: attempt, Follow: true})
	defer lr.Close()
	a.stream(w, r, lr, true)
}

// failFile answers an error of the object store: 404 for an object that
// is not there, 502 for one whose bytes differ from their digest.
func (a *API) failFile(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, artifact.ErrNotFound):
		writeJSON(w, http.StatusNotFound, &job.ErrorReply{Error: err.Error(), NotFound: true})
	case errors.Is(err, artifact.ErrChanged):
		a.d.log.Warn("a stored object differs from its digest", "err", err)
		writeJSON(w, http.StatusBadGateway, &job.ErrorReply{Error: err.Error()})
	default:
		a.fail(w, err)
	}
}

// setDigest sets the length and digest headers of bytes of a known size
// and SHA-256.
func setDigest(h http.Header, size int64, sha string) {
	raw, err := hex.DecodeString(sha)
	if err != nil {
		return
	}
	b64 := base64.StdEncoding.EncodeToString(raw)
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("ETag", `"`+sha+`"`)
	h.Set("Repr-Digest", "sha-256=:"+b64+":")
	h.Set("Digest", "SHA-256="+b64)
}

func contentType(ct string) string {
	if ct == "" {
		return "application/octet-stream"
	}
	return ct
}

// stream copies src to the response. A long response is not cut by the
// server's write timeout; with flush, every piece is sent as it comes. An
// error once the body has started (the bytes differ from their digest,
// the store went away) aborts the response, so that the client sees it
// cut short rather than complete.
func (a *API) stream(w http.ResponseWriter, r *http.Request, src io.Reader, flush bool) {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	buf := make([]byte, 64<<10)
	started := false
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !started {
				w.WriteHeader(http.StatusOK)
				started = true
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the client went away
			}
			if flush {
				_ = rc.Flush()
			}
		}
		switch {
		case err == io.EOF:
			if !started {
				w.WriteHeader(http.StatusOK)
			}
			return
		case err == nil:
			continue
		case !started && r.Context().Err() == nil:
			for _, k := range []string{"Content-Length", "ETag", "Repr-Digest", "Digest", "Content-Disposition", "X-Content-Type-Options"} {
				w.Header().Del(k)
			}
			a.failFile(w, err)
			return
		}
		if r.Context().Err() == nil {
			a.d.log.Warn("a file's response was cut short", "path", r.URL.Path, "err", err)
		}
		panic(http.ErrAbortHandler)
	}
}
