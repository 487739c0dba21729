package queue

import "github.com/nats-io/nats.go"

// Headers of the fleet's messages.
const (
	// HeaderMsgID is JetStream's de-duplication header.
	HeaderMsgID = nats.MsgIdHdr
	// HeaderSubmittedAt carries the submission time (RFC 3339, nanoseconds)
	// on job messages, for queue-wait measurements and queue_timeout.
	HeaderSubmittedAt = "Fleet-Submitted-At"
	// HeaderRecordRev carries the revision of the job's record when the job
	// was published, so that a worker's first write is a compare-and-set
	// against it and needs no read first.
	HeaderRecordRev = "Fleet-Record-Rev"
)

// HeaderCarrier adapts NATS headers to OpenTelemetry's TextMapCarrier, so
// trace context travels in the W3C traceparent header of each message.
type HeaderCarrier nats.Header

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string { return nats.Header(c).Get(key) }

// Set sets key to value.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Headers of dead letters: the failure and attempts that their body
// carries too (see DeadLetterBody), kept for the readers of before, which
// read them here.
const (
	HeaderFailureClass   = "Fleet-Failure-Class"
	HeaderFailureCode    = "Fleet-Failure-Code"
	HeaderFailureMessage = "Fleet-Failure-Message"
	HeaderAttempts       = "Fleet-Attempts"
)

// HeaderCancelNotice marks the dispatcher's own cancel messages to workers,
// as opposed to a user's cancel request.
const HeaderCancelNotice = "Fleet-Cancel-Notice"

// HeaderPoolRevision marks a dispatcher's word to a pool's workers that
// carries the pool's state it just wrote (a job.PoolState as the body),
// with the revision of the pools bucket's entry.
const HeaderPoolRevision = "Fleet-Pool-Revision"
