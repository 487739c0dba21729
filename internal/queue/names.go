// Package queue is the fleet's use of NATS JetStream: the subjects, streams,
// consumers and key-value bucket of the contract, how they are created, and
// how processes connect to NATS.
package queue

import (
	"strconv"
	"strings"

	"github.com/fleet-dev/fleet/job"
)

// Lag is a pool's consumer lag: jobs waiting in its queue, not yet
// delivered, and jobs delivered to its workers and not finished.
type Lag struct {
	Pending  uint64 `json:"pending"`
	InFlight int    `json:"in_flight"`
}

// Names derives every subject, stream, consumer and bucket name from the
// subject prefix, so that several fleets can share one NATS account.
//
// Contract v2, for the prefix "fleet": every subject a role writes or
// reads names what its permission needs, the tenant for producers and
// their readers, the pool for workers.
//
//	fleet.t.<tenant>.submit                request/reply: a submission, answered once stored
//	fleet.t.<tenant>.intake                stream FLEET_INTAKE: submissions kept until a dispatcher takes them
//	fleet.t.<tenant>.cancel.<id>           request/reply
//	fleet.t.<tenant>.status.<id>           request/reply: the job's record (with its result once it has one)
//	fleet.t.<tenant>.history.<id>          request/reply: every version of the job's record
//	fleet.t.<tenant>.job.<pool>.<kind>.<id>  every version of a record, live (the pool stream's RePublish)
//	fleet.t.<tenant>.ev.<pool>.<id>        heartbeat and log events, stream FLEET_EVENTS
//	fleet.p.<pool>.<kind>.<tenant>.<id>    stream FLEET_POOL_<pool>: the versions of each job's record;
//	                                       kind q<priority> queues the job (with its request),
//	                                       s is a later state, r the final one (with the result),
//	                                       x a rejected request (replaced by a later valid one)
//	fleet.stop.<pool>.<tenant>.<id>        core NATS: the dispatcher tells the pool's workers to stop an attempt
//	fleet.wake.<pool>                      core NATS: a job was queued for the pool
//	fleet.dlq.<pool>.<tenant>.<id>         stream FLEET_DLQ
//	fleet.t.<tenant>.schedules.<verb>.<name>  request/reply: create, update, delete, pause, resume, show a schedule
//	fleet.t.<tenant>.schedules.list        request/reply: the tenant's schedules
//	fleet-keys                             key-value bucket of the key that seals secrets
//	fleet-schedules                        key-value bucket of the schedules, their firings, and the
//	                                       lease of the dispatcher that fires them
//
// Contract v1, kept for one release behind the dispatcher's --v1:
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

// Contract v2 subjects (see Names).

// TenantRoot matches every subject of a tenant: what its producers may use.
func (n Names) TenantRoot(tenant string) string { return n.prefix() + ".t." + tenant + ".>" }

// SubmitV2 is where a tenant's producers submit requests and wait for the
// answer.
func (n Names) SubmitV2(tenant string) string { return n.prefix() + ".t." + tenant + ".submit" }

// AllSubmitV2 matches every tenant's submit subject.
func (n Names) AllSubmitV2() string { return n.prefix() + ".t.*.submit" }

// Intake is where a tenant's producers publish submissions to be kept
// until a dispatcher takes them.
func (n Names) Intake(tenant string) string { return n.prefix() + ".t." + tenant + ".intake" }

// AllIntake matches every tenant's intake subject.
func (n Names) AllIntake() string { return n.prefix() + ".t.*.intake" }

// Request is the subject of a tenant's request about a job: verb is
// cancel, status or history.
func (n Names) Request(tenant, verb, id string) string {
	return n.prefix() + ".t." + tenant + "." + verb + "." + id
}

// AllRequests matches every tenant's requests of a verb.
func (n Names) AllRequests(verb string) string { return n.prefix() + ".t.*." + verb + ".>" }

// Kinds of the subjects of a job in its pool's stream.
//
// A watcher of how jobs end subscribes to kinds r and x: a job that was
// queued ends with one version of kind r; a request a dispatcher refused
// has a version of kind x instead, which a later valid submission of the
// id replaces (it queues the job after it). Versions of kind r are never
// followed by another (see FinalMsgID); x, not being final, may be. Only
// dispatchers write q and x (the roles of deploy/nats); the pool's workers
// write s and r, as dispatchers do for a cancel.
const (
	KindState    = "s" // a state after the job was queued
	KindResult   = "r" // the final state, with the result
	KindRejected = "x" // a rejected request: the job's latest until it is submitted again
)

// KindQueued is the kind of the subject that queues a job at priority p.
func KindQueued(p int) string { return "q" + strconv.Itoa(p) }

// PoolJob is the subject of a job's record version of kind kind.
func (n Names) PoolJob(pool, kind, tenant, id string) string {
	return n.prefix() + ".p." + pool + "." + kind + "." + tenant + "." + id
}

// PoolJobAll matches every subject of one job: the compare-and-set of its
// record is against the last of them.
func (n Names) PoolJobAll(pool, tenant, id string) string {
	return n.prefix() + ".p." + pool + ".*." + tenant + "." + id
}

// PoolQueued matches the jobs queued in a pool at priority p.
func (n Names) PoolQueued(pool string, p int) string {
	return n.prefix() + ".p." + pool + "." + KindQueued(p) + ".>"
}

// PoolSubjects is what a pool's stream holds.
func (n Names) PoolSubjects(pool string) string { return n.prefix() + ".p." + pool + ".>" }

// AllPoolSubjects are the subjects of every pool's stream (v2).
func (n Names) AllPoolSubjects() string { return n.prefix() + ".p.>" }

// PoolStreamV2 is the stream of a pool's jobs and their states.
func (n Names) PoolStreamV2(pool string) string { return n.stream("POOL_" + pool) }

// JobLive is the subject a job's record versions are republished on.
func (n Names) JobLive(tenant, pool, kind, id string) string {
	return n.prefix() + ".t." + tenant + ".job." + pool + "." + kind + "." + id
}

// AllJobLive matches the live copies of every tenant's record versions.
func (n Names) AllJobLive() string { return n.prefix() + ".t.*.job.*.*.>" }

// ParseJobLive reads the subject of a record version's live copy.
func (n Names) ParseJobLive(subject string) (kind string, k JobKey, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix()+".t.")
	if !ok {
		return "", JobKey{}, false
	}
	// By hand, not with strings.Split: the console reads every version's.
	tenant, rest, ok1 := strings.Cut(rest, ".")
	rest, ok2 := strings.CutPrefix(rest, "job.")
	pool, rest, ok3 := strings.Cut(rest, ".")
	kind, id, ok4 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 || !ok4 || tenant == "" || pool == "" || kind == "" || id == "" {
		return "", JobKey{}, false
	}
	return kind, JobKey{Tenant: tenant, Pool: pool, ID: id}, true
}

// JobNotices is the subject of a job's heartbeat and log events.
func (n Names) JobNotices(tenant, pool, id string) string {
	return n.prefix() + ".t." + tenant + ".ev." + pool + "." + id
}

// AllNotices matches every tenant's heartbeat and log events.
func (n Names) AllNotices() string { return n.prefix() + ".t.*.ev.>" }

// Stop is where the dispatcher tells a pool's workers to stop a job's
// attempt.
func (n Names) Stop(pool, tenant, id string) string {
	return n.prefix() + ".stop." + pool + "." + tenant + "." + id
}

// PoolStops matches the stop notices of a pool's jobs.
func (n Names) PoolStops(pool string) string { return n.prefix() + ".stop." + pool + ".>" }

// PoolQueues is where a dispatcher tells a pool's workers what it changed:
// a new queue it made (its consumer's name as the body), so that they bind
// to it at once, or the pool's state it wrote (a job.PoolState, with
// HeaderPoolRevision), so that they know it before any job queued after.
func (n Names) PoolQueues(pool string) string { return n.prefix() + ".queues." + pool }

// ParseStop reads a stop notice's subject.
func (n Names) ParseStop(subject string) (pool, tenant, id string, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix()+".stop.")
	if !ok {
		return "", "", "", false
	}
	parts := strings.SplitN(rest, ".", 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// Wake is where a dispatcher says it queued a job for the pool.
func (n Names) Wake(pool string) string { return n.prefix() + ".wake." + pool }

// DLQV2 is the dead-letter subject of a job.
func (n Names) DLQV2(pool, tenant, id string) string {
	return n.prefix() + ".dlq." + pool + "." + tenant + "." + id
}

// KeysBucket holds the key that seals requests' secrets.
func (n Names) KeysBucket() string { return n.prefix() + "-keys" }

// IntakeStream keeps v2 submissions until a dispatcher takes them.
func (n Names) IntakeStream() string { return n.stream("INTAKE") }

// JobKey is a job's place in the fleet: its tenant, pool and id.
type JobKey struct{ Tenant, Pool, ID string }

// ParsePoolJob reads a subject of a pool's stream.
func (n Names) ParsePoolJob(subject string) (kind string, k JobKey, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix()+".p.")
	if !ok {
		return "", JobKey{}, false
	}
	parts := strings.SplitN(rest, ".", 4)
	if len(parts) != 4 {
		return "", JobKey{}, false
	}
	return parts[1], JobKey{Tenant: parts[2], Pool: parts[0], ID: parts[3]}, true
}

// ParseTenantRequest reads a tenant's request subject
// (<prefix>.t.<tenant>.<verb>.<id>).
func (n Names) ParseTenantRequest(subject string) (tenant, verb, id string, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix()+".t.")
	if !ok {
		return "", "", "", false
	}
	parts := strings.SplitN(rest, ".", 3)
	switch len(parts) {
	case 2:
		return parts[0], parts[1], "", true
	case 3:
		return parts[0], parts[1], parts[2], true
	}
	return "", "", "", false
}

// Pool is the subject of a request about a pool: verb is pause, resume or
// show.
func (n Names) Pool(pool, verb string) string { return n.prefix() + ".pools." + pool + "." + verb }

// AllPools matches every request about a pool.
func (n Names) AllPools() string { return n.prefix() + ".pools.>" }

// PoolsBucket holds each pool's PoolState, by pool.
func (n Names) PoolsBucket() string { return n.prefix() + "-pools" }

// ScheduleRequest is the subject of a tenant's request about one of its
// schedules: verb is create, update, delete, pause, resume or show.
func (n Names) ScheduleRequest(tenant, verb, name string) string {
	return n.prefix() + ".t." + tenant + ".schedules." + verb + "." + name
}

// ScheduleList is the subject of the request that lists a tenant's
// schedules.
func (n Names) ScheduleList(tenant string) string {
	return n.prefix() + ".t." + tenant + ".schedules.list"
}

// AllScheduleRequests matches every tenant's requests about schedules.
func (n Names) AllScheduleRequests() string { return n.prefix() + ".t.*.schedules.>" }

// ParseScheduleRequest reads a request's subject about schedules: its
// tenant, verb and, but for a list, the schedule's name.
func (n Names) ParseScheduleRequest(subject string) (tenant, verb, name string, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix()+".t.")
	if !ok {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	switch {
	case len(parts) == 3 && parts[1] == "schedules":
		return parts[0], parts[2], "", true
	case len(parts) == 4 && parts[1] == "schedules":
		return parts[0], parts[2], parts[3], true
	}
	return "", "", "", false
}

// SchedulesBucket holds the schedules, what their firings did, and the
// lease of the dispatcher that fires them.
func (n Names) SchedulesBucket() string { return n.prefix() + "-schedules" }

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

// QueueConsumer is the durable consumer of one queue of a pool: the jobs
// one tenant queued at priority p (contract v2). Workers pull from a
// pool's queues in the order its sharing policy gives (see
// internal/producer/share.go).
func (n Names) QueueConsumer(p int, tenant string) string {
	return KindQueued(p) + "-" + tenant
}

// ParseQueueConsumer reads a queue consumer's name.
func (n Names) ParseQueueConsumer(name string) (p int, tenant string, ok bool) {
	kind, tenant, ok := strings.Cut(name, "-")
	if !ok || len(kind) != 2 || kind[0] != 'q' || !job.ValidTenant(tenant) {
		return 0, "", false
	}
	p = int(kind[1] - '0')
	if p < job.HighestPriority || p > job.LowestPriority {
		return 0, "", false
	}
	return p, tenant, true
}

// PoolQueue matches the jobs one tenant queued in a pool at priority p.
func (n Names) PoolQueue(pool string, p int, tenant string) string {
	return n.prefix() + ".p." + pool + "." + KindQueued(p) + "." + tenant + ".>" // ids may hold dots
}

// PoolQueuedLive matches the republished copies of the versions that queue
// a pool's jobs at priority p, of every tenant: a worker that pulls from
// several queues hears of new work on them.
func (n Names) PoolQueuedLive(pool string, p int) string {
	return n.prefix() + ".t.*.job." + pool + "." + KindQueued(p) + ".>"
}
