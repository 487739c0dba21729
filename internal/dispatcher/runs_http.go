package dispatcher

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/fleet-dev/fleet/internal/runs"
	"github.com/fleet-dev/fleet/job"
)

// serveRuns adds the runs' routes, each acting as the request's tenant
// (TenantOf), so that a tenant's token reaches its own runs only:
//
//	POST /v1/runs              submit a run (the body is the run): 201, or 200
//	                           for a run whose id the tenant has already; 400
//	                           with every problem of a run refused
//	GET  /v1/runs              the tenant's runs still kept, oldest first
//	GET  /v1/runs/{id}         a run as it stands: its state, round and nodes
//	POST /v1/runs/{id}/cancel  cancel a run's nodes that have not ended
//	POST /v1/runs/{id}/retry   run again what did not succeed of an ended
//	                           run: 409 while it has not ended
//
// A run the tenant does not have is 404.
func (a *API) serveRuns() {
	a.mux.HandleFunc("POST /v1/runs", a.submitRun)
	a.mux.HandleFunc("GET /v1/runs", a.listRuns)
	a.mux.HandleFunc("GET /v1/runs/{id}", a.runVerb("status"))
	a.mux.HandleFunc("POST /v1/runs/{id}/cancel", a.runVerb("cancel"))
	a.mux.HandleFunc("POST /v1/runs/{id}/retry", a.runVerb("retry"))
}

func (a *API) submitRun(w http.ResponseWriter, r *http.Request) {
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	// A run's definition is one message: it is bounded by the server's
	// max payload, not by a request's limit.
	limit := a.d.nc.MaxPayload()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeJSON(w, http.StatusRequestEntityTooLarge, &job.RunSubmitReply{Tenant: tenant,
			Error: fmt.Sprintf("the run is over the limit of %d bytes", limit)})
		return
	case err != nil:
		writeJSON(w, http.StatusBadRequest, &job.RunSubmitReply{Tenant: tenant, Error: "reading the run: " + err.Error()})
		return
	}
	reply, err := a.d.SubmitRun(r.Context(), tenant, body)
	switch {
	case err != nil:
		a.d.log.Warn("run submission failed", "tenant", tenant, "err", err)
		writeJSON(w, http.StatusServiceUnavailable, &job.RunSubmitReply{Tenant: tenant,
			Error: "the fleet cannot take the run now; try again with the same id"})
	case reply.Rejected():
		writeJSON(w, http.StatusBadRequest, reply)
	case reply.Duplicate:
		writeJSON(w, http.StatusOK, reply)
	default:
		w.Header().Set("Location", "/v1/runs/"+reply.RunID)
		writeJSON(w, http.StatusCreated, reply)
	}
}

func (a *API) listRuns(w http.ResponseWriter, r *http.Request) {
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	list, err := a.d.ListRuns(r.Context(), tenant)
	if err != nil {
		a.fail(w, err)
		return
	}
	if list.Runs == nil {
		list.Runs = []string{}
	}
	writeJSON(w, http.StatusOK, list)
}

// runVerb serves a request about the run the path names.
func (a *API) runVerb(verb string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, err := TenantOf(r)
		if err != nil {
			a.fail(w, err)
			return
		}
		id := r.PathValue("id")
		var v any
		switch verb {
		case "status":
			v, err = a.d.RunStatus(r.Context(), tenant, id)
		case "cancel":
			v, err = a.d.CancelRun(r.Context(), tenant, id)
		case "retry":
			var reply *job.RunReply
			var none error
			reply, none, err = a.d.retryRun(r.Context(), tenant, id)
			if errors.Is(none, runs.ErrRunNotEnded) {
				writeJSON(w, http.StatusConflict, &job.ErrorReply{Error: fmt.Sprintf(
					"run %s has not ended (round %d is running): cancel it first (POST /v1/runs/%s/cancel), or wait for its end, then retry it",
					id, reply.Round, id)})
				return
			}
			v = reply
		}
		if err != nil {
			a.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}
