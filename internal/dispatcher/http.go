package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// API serves the dispatcher's HTTP API:
//
//	POST /v1/jobs               submit a request (the body is the request)
//	GET  /v1/jobs/{id}          a job's state and, once it has one, its result
//	POST /v1/jobs/{id}/cancel   cancel a job
//	GET  /v1/jobs/{id}/outputs/{name}   a declared output (see serveArtifacts)
//	GET  /v1/jobs/{id}/logs     an attempt's log
//	/v1/schedules...            schedules (see serveSchedules)
//	/v1/runs...                 runs, graphs of jobs (see serveRuns)
//	GET  /healthz               the process is up
//	GET  /readyz                the dispatcher can take submissions
//
// The capacity routes are added with ServeCapacity, others (metrics) with
// Handle.
type API struct {
	d   *Dispatcher
	mux *http.ServeMux

	arts     *artifact.Store // made on first use
	artsOnce sync.Once
}

// NewAPI returns the API of d.
func NewAPI(d *Dispatcher) *API {
	a := &API{d: d, mux: http.NewServeMux()}
	a.mux.HandleFunc("POST /v1/jobs", a.submit)
	a.mux.HandleFunc("GET /v1/jobs/{id}", a.status)
	a.mux.HandleFunc("POST /v1/jobs/{id}/cancel", a.cancel)
	a.mux.HandleFunc("GET /v1/pools/{pool}", a.pool)
	a.mux.HandleFunc("POST /v1/pools/{pool}/pause", a.pause)
	a.mux.HandleFunc("POST /v1/pools/{pool}/resume", a.pause)
	a.mux.HandleFunc("POST /v1/pools/{pool}/policy", a.setPolicy)
	a.serveArtifacts()
	a.serveSchedules()
	a.serveRuns()
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	a.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := d.Ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return a
}

// Handle adds a route.
func (a *API) Handle(pattern string, h http.Handler) { a.mux.Handle(pattern, h) }

// ServeCapacity adds the capacity routes, answered from the heartbeats in
// caps:
//
//	GET /v1/capacity[?pool=P]   the pools, summed, and the live workers
//	GET /v1/workers[?pool=P]    the live workers' heartbeats
func (a *API) ServeCapacity(caps *capacity.Store) {
	serve := func(answer func([]*job.Heartbeat) any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			hbs, err := caps.Workers(r.Context(), r.URL.Query().Get("pool"))
			if err != nil {
				if !errors.Is(err, capacity.ErrUnavailable) {
					a.d.log.Warn("reading capacity failed", "err", err)
				}
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "capacity is unavailable now; try again"})
				return
			}
			if hbs == nil {
				hbs = []*job.Heartbeat{}
			}
			writeJSON(w, http.StatusOK, answer(hbs))
		}
	}
	a.mux.Handle("GET /v1/capacity", serve(func(hbs []*job.Heartbeat) any {
		pools := monitor.Summarize(hbs)
		for i := range pools {
			// Best effort: a pool whose state cannot be read shows as
			// running, as it would to its workers.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if s, err := queue.ReadPool(ctx, a.d.poolStates, pools[i].Pool); err == nil {
				pools[i].Paused = s.Paused
			}
			cancel()
		}
		return monitor.Overview{Pools: pools, Workers: hbs}
	}))
	a.mux.Handle("GET /v1/workers", serve(func(hbs []*job.Heartbeat) any { return hbs }))
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

func (a *API) submit(w http.ResponseWriter, r *http.Request) {
	limit := a.d.cfg.Limits.MaxRequestBytes
	if limit <= 0 {
		limit = job.DefaultLimits.MaxRequestBytes
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeJSON(w, http.StatusRequestEntityTooLarge, &job.SubmitReply{Error: fmt.Sprintf("request is over the limit of %d bytes", limit)})
		return
	case err != nil:
		writeJSON(w, http.StatusBadRequest, &job.SubmitReply{Error: "reading request: " + err.Error()})
		return
	}
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	reply, err := a.d.Submit(withSubmission(r.Context(), r.Header.Get(job.SubmissionHeader)), tenant, body)
	if reply != nil {
		reply.Stream, reply.Seq = "", 0 // for JetStream publishers only
	}
	switch {
	case err != nil:
		a.d.log.Warn("submission failed", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, &job.SubmitReply{Error: "the fleet cannot take the request now; try again"})
	case reply.Rejected():
		writeJSON(w, http.StatusBadRequest, reply)
	case reply.Duplicate:
		writeJSON(w, http.StatusOK, reply)
	default:
		writeJSON(w, http.StatusAccepted, reply)
	}
}

func (a *API) status(w http.ResponseWriter, r *http.Request) {
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	s, err := a.d.Status(r.Context(), tenant, r.PathValue("id"))
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s)
}

func (a *API) cancel(w http.ResponseWriter, r *http.Request) {
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	c, err := a.d.Cancel(r.Context(), tenant, r.PathValue("id"))
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (a *API) pool(w http.ResponseWriter, r *http.Request) {
	s, err := a.d.Pool(r.Context(), r.PathValue("pool"))
	if err != nil {
		a.fail(w, err)
		return
	}
	if t := tenantOnly(r); t != "" {
		// A tenant sees how it fares, not how the others do.
		s.Tenants = slices.DeleteFunc(s.Tenants, func(o job.TenantShare) bool { return o.Tenant != t })
		s.Policy = nil
	}
	writeJSON(w, http.StatusOK, s)
}

// pause pauses or resumes a pool, as the path says; the body, when there
// is one, is a job.PoolChange.
func (a *API) pause(w http.ResponseWriter, r *http.Request) {
	if err := operatorOnly(r); err != nil {
		a.fail(w, err)
		return
	}
	var change job.PoolChange
	if r.ContentLength != 0 {
		if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&change); err != nil {
			writeJSON(w, http.StatusBadRequest, &job.ErrorReply{Error: "the body is not a JSON object with a reason: " + err.Error()})
			return
		}
	}
	paused := strings.HasSuffix(r.URL.Path, "/pause")
	s, err := a.d.SetPaused(r.Context(), r.PathValue("pool"), paused, &change)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s)
}

// setPolicy changes how a pool is shared; the body is a job.PolicyChange.
func (a *API) setPolicy(w http.ResponseWriter, r *http.Request) {
	if err := operatorOnly(r); err != nil {
		a.fail(w, err)
		return
	}
	var change job.PolicyChange
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&change); err != nil {
		writeJSON(w, http.StatusBadRequest, &job.ErrorReply{Error: "the body is not a policy change: " + err.Error()})
		return
	}
	s, err := a.d.SetPolicy(r.Context(), r.PathValue("pool"), &change)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s)
}

func (a *API) fail(w http.ResponseWriter, err error) {
	if errors.Is(err, queue.ErrNotFound) {
		writeJSON(w, http.StatusNotFound, &job.ErrorReply{Error: err.Error(), NotFound: true})
		return
	}
	if isInvalid(err) {
		writeJSON(w, http.StatusBadRequest, &job.ErrorReply{Error: err.Error()})
		return
	}
	if errors.Is(err, errForbidden) {
		writeJSON(w, http.StatusForbidden, &job.ErrorReply{Error: err.Error()})
		return
	}
	a.d.log.Warn("request failed", "err", err)
	writeJSON(w, http.StatusServiceUnavailable, &job.ErrorReply{Error: "the fleet cannot answer now; try again"})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
