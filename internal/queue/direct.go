package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// directLast reads the last message on subject in stream with one direct
// get request (the stream allows direct gets): no stream lookup first.
// It returns nil, nil when the subject has no message.
func directLast(ctx context.Context, nc *nats.Conn, stream, subject string) (*nats.Msg, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("direct get %s: %w", subject, err)
	}
	switch m.Header.Get("Status") {
	case "":
		return m, nil
	case "404":
		return nil, nil
	default:
		return nil, fmt.Errorf("direct get %s: %s %s", subject, m.Header.Get("Status"), m.Header.Get("Description"))
	}
}

// LastResult returns a job's result, or nil when it has none yet.
func LastResult(ctx context.Context, js jetstream.JetStream, n Names, id string) (*job.Result, error) {
	m, err := directLast(ctx, js.Conn(), n.ResultsStream(), n.Results(id))
	if err != nil || m == nil {
		return nil, err
	}
	r, err := job.DecodeResult(m.Data)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("result of job %s", id), err)
	}
	return r, nil
}

// Status reads a job's record and, when it may have one, its result, and
// joins them (see job.NewStatusReply). It returns the record's revision.
func (s *Store) Status(ctx context.Context, id string) (*job.StatusReply, uint64, error) {
	if !job.ValidID(id) {
		return nil, 0, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id)
	}
	rec, rev, err := s.Get(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	var res *job.Result
	if rec.NeedsResult() {
		if res, err = LastResult(ctx, s.js, s.names, id); err != nil {
			return nil, 0, err
		}
	}
	return job.NewStatusReply(rec, res), rev, nil
}
