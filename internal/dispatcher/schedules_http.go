package dispatcher

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/fleet-dev/fleet/job"
)

// serveSchedules adds the schedules' routes, each acting as the request's
// tenant (TenantOf):
//
//	POST   /v1/schedules               make a schedule (the body is the schedule)
//	GET    /v1/schedules               the tenant's schedules, each with its next firing
//	GET    /v1/schedules/{name}        a schedule, its next five firings and its last ones
//	PUT    /v1/schedules/{name}        replace a schedule (without a template: keep its own)
//	DELETE /v1/schedules/{name}        delete a schedule
//	POST   /v1/schedules/{name}/pause  pause it; /resume resumes it
func (a *API) serveSchedules() {
	a.mux.HandleFunc("POST /v1/schedules", a.createSchedule)
	a.mux.HandleFunc("GET /v1/schedules", a.listSchedules)
	a.mux.HandleFunc("GET /v1/schedules/{name}", a.scheduleVerb("show"))
	a.mux.HandleFunc("PUT /v1/schedules/{name}", a.scheduleVerb("update"))
	a.mux.HandleFunc("DELETE /v1/schedules/{name}", a.scheduleVerb("delete"))
	a.mux.HandleFunc("POST /v1/schedules/{name}/pause", a.scheduleVerb("pause"))
	a.mux.HandleFunc("POST /v1/schedules/{name}/resume", a.scheduleVerb("resume"))
}

func (a *API) createSchedule(w http.ResponseWriter, r *http.Request) {
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	body, ok := a.readBody(w, r)
	if !ok {
		return
	}
	info, err := a.d.CreateSchedule(r.Context(), tenant, "", body)
	if err != nil {
		a.scheduleFail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (a *API) listSchedules(w http.ResponseWriter, r *http.Request) {
	tenant, err := TenantOf(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	list, err := a.d.ListSchedules(r.Context(), tenant)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

// scheduleVerb serves a request about the schedule the path names.
func (a *API) scheduleVerb(verb string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, err := TenantOf(r)
		if err != nil {
			a.fail(w, err)
			return
		}
		var body []byte
		if verb == "update" {
			var ok bool
			if body, ok = a.readBody(w, r); !ok {
				return
			}
		}
		v, err := a.d.scheduleRequest(r.Context(), tenant, verb, r.PathValue("name"), body)
		if err != nil {
			a.scheduleFail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// readBody reads a request's body within the request size limit.
func (a *API) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := a.d.cfg.Limits.MaxRequestBytes
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeJSON(w, http.StatusRequestEntityTooLarge, &job.ErrorReply{Error: fmt.Sprintf("the body is over the limit of %d bytes", limit)})
		return nil, false
	case err != nil:
		writeJSON(w, http.StatusBadRequest, &job.ErrorReply{Error: "reading the body: " + err.Error()})
		return nil, false
	}
	return body, true
}

func (a *API) scheduleFail(w http.ResponseWriter, err error) {
	if errors.Is(err, errExists) {
		writeJSON(w, http.StatusConflict, &job.ErrorReply{Error: err.Error(), Exists: true})
		return
	}
	a.fail(w, err)
}
