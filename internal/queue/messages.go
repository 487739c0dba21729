package queue

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/job"
)

// EventMsg builds the message of a lifecycle event. Its id makes a
// republished event (a worker redoing a step after a crash) a duplicate
// that JetStream drops; seq tells apart several log or heartbeat events of
// one attempt.
func (n Names) EventMsg(e *job.Event, seq int) (*nats.Msg, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode event: %w", err)
	}
	m := nats.NewMsg(n.Events(e.JobID))
	m.Data = data
	id := e.JobID + "/" + strconv.Itoa(e.Attempt) + "/" + string(e.Type)
	if seq > 0 {
		id += "/" + strconv.Itoa(seq)
	}
	m.Header.Set(HeaderMsgID, id)
	return m, nil
}

// NoticeMsg builds the message of a heartbeat or log event (contract v2):
// on its job's tenant's subject, stored best effort, never acknowledged.
func (n Names) NoticeMsg(e *job.Event) (*nats.Msg, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode event: %w", err)
	}
	tenant := e.Tenant
	if tenant == "" {
		tenant = job.DefaultTenant
	}
	m := nats.NewMsg(n.JobNotices(tenant, e.Pool, e.JobID))
	m.Data = data
	return m, nil
}

// ResultMsg builds the message of a job's result. The results stream keeps
// one message per subject and refuses a second; the id also makes a
// republished result a duplicate.
func (n Names) ResultMsg(r *job.Result) (*nats.Msg, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	m := nats.NewMsg(n.ResultsIn(r.JobID))
	m.Data = data
	m.Header.Set(HeaderMsgID, r.JobID+"/result")
	return m, nil
}

// IsResultExists reports the error of publishing a second result for a job:
// the first one stands.
func IsResultExists(err error) bool {
	return err != nil && strings.Contains(err.Error(), "maximum messages per subject exceeded")
}
