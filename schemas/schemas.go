// Package schemas embeds the JSON Schemas (draft 2020-12) of the fleet's
// documents, so that programs can serve them and tests can check the Go
// types against them.
package schemas

import "embed"

// Names of the schema files.
const (
	ExecutionRequest  = "execution-request.v1.json"
	LifecycleEvent    = "lifecycle-event.v1.json"
	Result            = "result.v1.json"
	CapacityHeartbeat = "capacity-heartbeat.v1.json"
)

// BaseURL is the prefix of every schema's $id.
const BaseURL = "https://fleet.dev/schemas/"

// FS holds the schema files.
//
//go:embed *.json
var FS embed.FS
