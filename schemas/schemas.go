// Package schemas embeds the JSON Schemas (draft 2020-12) of the fleet's
// documents, so that programs can serve them and tests can check the Go
// types against them.
package schemas

import "embed"

// Names of the schema files of contract v1.
const (
	ExecutionRequest  = "execution-request.v1.json"
	LifecycleEvent    = "lifecycle-event.v1.json"
	Result            = "result.v1.json"
	CapacityHeartbeat = "capacity-heartbeat.v1.json"
)

// Names of the schema files of contract v2. Results are unchanged in v2:
// Result.
const (
	// ExecutionRequestV2 is the v1 request with a priority.
	ExecutionRequestV2 = "execution-request.v2.json"
	// LifecycleEventV2 is the v1 event with the job's tenant.
	LifecycleEventV2 = "lifecycle-event.v2.json"
	// JobRecordV2 is a version of a job's record, as its pool's stream
	// keeps it (job.Record).
	JobRecordV2 = "job-record.v2.json"
)

// Names of the schema files of runs, graphs of jobs submitted at once
// (job.RunRequest), which came with contract v2.
const (
	// RunRequest is what a producer submits: a run's nodes, each a v2
	// execution request.
	RunRequest = "run-request.v1.json"
	// RunRecord is every message of a run that the runs' stream keeps:
	// its definition, the ends of its nodes, its cancels, retries and
	// ends, each one of the schema's $defs.
	RunRecord = "run-record.v1.json"
	// RunAnswer is what the dispatchers answer a tenant about its runs:
	// a submission's reply, a run's view, a cancel's or a retry's reply,
	// the list, each one of the schema's $defs.
	RunAnswer = "run-answer.v1.json"
)

// Feed is a tenant's request for a consumer of its feed, and the answer,
// each one of the schema's $defs (job.FeedRequest, job.FeedReply).
const Feed = "feed.v1.json"

// BaseURL is the prefix of every schema's $id.
const BaseURL = "https://fleet.dev/schemas/"

// FS holds the schema files.
//
//go:embed *.json
var FS embed.FS
