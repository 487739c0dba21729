// Package job holds the contract of the fleet: the execution request a
// producer submits, the lifecycle events and the result a job produces, the
// state kept for each job, and the capacity heartbeat each worker reports.
//
// Every process of the fleet, and every producer or consumer written in Go,
// speaks through these types. Their JSON field names are the contract; the
// JSON Schemas in the repository's schemas/ folder describe the same
// documents and are tested against this package with shared fixtures.
//
// The package depends on the standard library only.
package job
