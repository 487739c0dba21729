// Package version holds the fleet's version, set at build time with
// -ldflags "-X github.com/fleet-dev/fleet/internal/version.Version=v1.2.3".
package version

// Version of the binaries.
var Version = "dev"
