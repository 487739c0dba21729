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
// get request (the stream allows direct gets): no stream lookup first. Any
// replica may answer, so on a cluster the answer may be a moment behind.
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

// leaderLast reads the last message on subject in stream from the stream's
// leader, which has every message it acknowledged. It returns nil, nil
// when the subject has no message.
func leaderLast(ctx context.Context, nc *nats.Conn, stream, subject string) ([]byte, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", subject, err)
	}
	var resp struct {
		Message *struct {
			Data []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("get %s: %w", subject, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, nil
	case resp.Error != nil:
		return nil, fmt.Errorf("get %s: %w", subject, resp.Error)
	case resp.Message == nil:
		return nil, fmt.Errorf("get %s: empty answer", subject)
	}
	return resp.Message.Data, nil
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

// PublishResult publishes a job's one result and returns the result that
// stands: res, or the one published before it (by an earlier delivery of
// the job, or by a cancel). The results stream keeps one message per job
// and refuses a second. When the answer to a publish is lost, the stream's
// leader is asked whether the result is stored before it is sent again, so
// that no subscriber, of the stream or of the subject, sees a result
// twice.
func PublishResult(ctx context.Context, js jetstream.JetStream, n Names, res *job.Result) (*job.Result, error) {
	m, err := n.ResultMsg(res)
	if err != nil {
		return nil, err
	}
	var stood *job.Result
	unsure := false
	err = Retry(ctx, func(ctx context.Context) error {
		if unsure {
			data, err := leaderLast(ctx, js.Conn(), n.ResultsStream(), n.Results(res.JobID))
			if err != nil {
				return err
			}
			if data != nil {
				stood, err = job.DecodeResult(data)
				return err
			}
		}
		ack, err := js.PublishMsg(ctx, m)
		switch {
		case err == nil && !ack.Duplicate:
			stood = res
			return nil
		case err == nil || IsResultExists(err):
			// Another result stands: read it.
			unsure = true
			return errUnsettled
		}
		unsure = unsure || Ambiguous(err)
		return err
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("publish result of job %s: %w", res.JobID, err)
	}
	return stood, nil
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
