package job_test

import (
	"encoding/json"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

// BenchmarkDecodeValidateRequest is the work every process does with each
// request it receives: strict decode, validation, defaults.
func BenchmarkDecodeValidateRequest(b *testing.B) {
	r := &job.Request{ID: "bench-1", Command: []string{"sh", "-c", "echo hi > $FLEET_OUTPUTS/out"},
		Env: map[string]string{"A": "b"}, Outputs: []string{"out"}, Labels: map[string]string{"team": "x"}}
	r.Normalize()
	data, _ := json.Marshal(r)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		req, err := job.DecodeRequest(data, job.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		if err := req.Validate(job.Limits{}); err != nil {
			b.Fatal(err)
		}
		req.Normalize()
	}
}
