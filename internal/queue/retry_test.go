package queue

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Which errors setup waits out: the ones a cluster electing its leaders or
// a dispatcher not started yet cause; not a configuration to fix.
func TestClassify(t *testing.T) {
	api := func(code jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("create stream X: %w", &jetstream.APIError{ErrorCode: code, Description: desc})
	}
	for _, tc := range []struct {
		err  error
		want kind
	}{
		{fmt.Errorf("call: %w", context.DeadlineExceeded), transient},
		{nats.ErrTimeout, transient},
		{api(10008, "JetStream system temporarily unavailable"), transient},
		{api(10009, "JetStream cluster can not handle request"), transient},
		{jetstream.ErrStreamNotFound, transient},
		{fmt.Errorf("open: %w", jetstream.ErrBucketNotFound), transient},
		{jetstream.ErrStreamNameAlreadyInUse, transient},
		{api(10005, "no suitable peers for placement"), placement},
		{api(10023, "insufficient resources"), placement},
		{api(10074, "replicas > 1 not supported in non-clustered mode"), permanent},
		{api(10052, "stream configuration update can not change storage type"), permanent},
		{jetstream.ErrJetStreamNotEnabled, permanent},
		{jetstream.ErrJetStreamNotEnabledForAccount, permanent},
		{nats.ErrConnectionClosed, permanent},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
