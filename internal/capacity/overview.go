package capacity

import (
	"encoding/json"
	"net/http"

	"github.com/fleet-dev/fleet/job"
)

// Overview is the answer of GET /v1/capacity: the pools, summed, and the
// live workers' heartbeats.
type Overview struct {
	Pools   []job.PoolCapacity `json:"pools"`
	Workers []*job.Heartbeat   `json:"workers"`
}

// CapacityHandler serves GET /v1/capacity[?pool=P].
func (s *Store) CapacityHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hbs, err := s.Workers(r.Context(), r.URL.Query().Get("pool"))
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "capacity unavailable: " + err.Error()})
			return
		}
		if hbs == nil {
			hbs = []*job.Heartbeat{}
		}
		writeJSON(w, http.StatusOK, Overview{Pools: Summarize(hbs), Workers: hbs})
	})
}

// WorkersHandler serves GET /v1/workers[?pool=P]: the live workers'
// heartbeats.
func (s *Store) WorkersHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hbs, err := s.Workers(r.Context(), r.URL.Query().Get("pool"))
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "capacity unavailable: " + err.Error()})
			return
		}
		if hbs == nil {
			hbs = []*job.Heartbeat{}
		}
		writeJSON(w, http.StatusOK, hbs)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
