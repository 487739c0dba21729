// Package queue is the fleet's use of NATS JetStream: the subjects, streams,
// consumers and key-value bucket of the contract, how they are created, and
// how processes connect to NATS.
package queue

import (
	"strings"
)

// Lag is a pool's consumer lag: jobs waiting in its queue, not yet
// delivered, and jobs delivered to its workers and not finished.
type Lag struct {
	Pending  uint64 `json:"pending"`
	InFlight int    `json:"in_flight"`
}

// Names derives every subject, stream, consumer and bucket name from the
// subject prefix, so that several fleets can share one NATS account.
// For the prefix "fleet":
//
//	fleet.submit            stream FLEET_SUBMIT (work queue)
//	fleet.submit.direct     core NATS, answered by one dispatcher (queue group)
//	fleet.jobs.<pool>       stream FLEET_JOBS_<pool> (work queue), consumer jobs-<pool>
//	fleet.events.<job_id>   stream FLEET_EVENTS (limits, max age)
//	fleet.results.<job_id>  stream FLEET_RESULTS (limits, max age, one per job),
//	                        published on fleet.results-in.<job_id>: stored, then republished
//	fleet.cancel.<job_id>   core NATS
//	fleet.dlq.<pool>        stream FLEET_DLQ
//	fleet-jobs              key-value bucket of job states
type Names struct {
	Prefix string
}

// DefaultPrefix is the subject prefix of the contract.
const DefaultPrefix = "fleet"

// ValidPrefix reports whether p can prefix every name: it becomes a token
// of the subjects, part of the stream names and of the bucket names, which
// allow only letters, digits, - and _.
func ValidPrefix(p string) bool {
	if p == "" || len(p) > 32 {
		return false
	}
	for _, r := range p {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

func (n Names) prefix() string {
	if n.Prefix == "" {
		return DefaultPrefix
	}
	return n.Prefix
}

func (n Names) stream(s string) string {
	return strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(n.prefix())) + "_" + s
}

// Subjects.
func (n Names) Submit() string             { return n.prefix() + ".submit" }
func (n Names) SubmitDirect() string       { return n.prefix() + ".submit.direct" }
func (n Names) Jobs(pool string) string    { return n.prefix() + ".jobs." + pool }
func (n Names) AllJobs() string            { return n.prefix() + ".jobs.>" }
func (n Names) Events(id string) string    { return n.prefix() + ".events." + id }
func (n Names) AllEvents() string          { return n.prefix() + ".events.>" }
func (n Names) Results(id string) string   { return n.prefix() + ".results." + id }
func (n Names) AllResults() string         { return n.prefix() + ".results.>" }
func (n Names) ResultsIn(id string) string { return n.prefix() + ".results-in." + id }
func (n Names) AllResultsIn() string       { return n.prefix() + ".results-in.>" }
func (n Names) Cancel(id string) string    { return n.prefix() + ".cancel." + id }
func (n Names) AllCancels() string         { return n.prefix() + ".cancel.>" }
func (n Names) DLQ(pool string) string     { return n.prefix() + ".dlq." + pool }
func (n Names) AllDLQ() string             { return n.prefix() + ".dlq.>" }
func (n Names) KVSubject(id string) string { return "$KV." + n.Bucket() + "." + id }

// Pool is the subject of a request about a pool: verb is pause, resume or
// show.
func (n Names) Pool(pool, verb string) string { return n.prefix() + ".pools." + pool + "." + verb }

// AllPools matches every request about a pool.
func (n Names) AllPools() string { return n.prefix() + ".pools.>" }

// PoolsBucket holds each pool's PoolState, by pool.
func (n Names) PoolsBucket() string { return n.prefix() + "-pools" }

// Dispatchers is where dispatchers tell each other they run.
func (n Names) Dispatchers() string { return n.prefix() + ".dispatchers" }

// IntakeBucket holds the dispatchers' claims on reply subjects, for a
// minute each.
func (n Names) IntakeBucket() string { return n.prefix() + "-intake" }

// JobID returns the job id at the end of an events, results or cancel
// subject. Ids may contain dots, so it is everything after the third token.
func (n Names) JobID(subject string) string {
	p := n.prefix() + "."
	if !strings.HasPrefix(subject, p) {
		return ""
	}
	_, id, _ := strings.Cut(subject[len(p):], ".")
	return id
}

// Streams, consumers and the bucket.
func (n Names) SubmitStream() string          { return n.stream("SUBMIT") }
func (n Names) JobsStream(pool string) string { return n.stream("JOBS_" + pool) }

// SharedJobsStream is the one jobs stream of every pool that fleets
// created before each pool had its own. Where it exists, it captures every
// pool's subject, and the fleet goes on using it (see PoolStream).
func (n Names) SharedJobsStream() string { return n.stream("JOBS") }
func (n Names) EventsStream() string     { return n.stream("EVENTS") }
func (n Names) ResultsStream() string    { return n.stream("RESULTS") }
func (n Names) DLQStream() string        { return n.stream("DLQ") }
func (n Names) Bucket() string           { return n.prefix() + "-jobs" }

// IntakeConsumer is the durable consumer the dispatchers share on the submit
// stream.
func (n Names) IntakeConsumer() string { return "dispatcher" }

// PoolConsumer is the durable consumer a pool's workers share.
func (n Names) PoolConsumer(pool string) string { return "jobs-" + pool }
