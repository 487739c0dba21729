// Package testenv decides what a test does when something it needs (Docker,
// redis-server, a Kubernetes control plane, a tool) is missing: under CI it
// fails, elsewhere it skips. It imports nothing of the fleet, so every test
// helper can use it.
package testenv

import (
	"os"
	"testing"
)

// InCI reports whether the tests run under CI (CI set, and not "false" or
// "0"), where a missing dependency is a failure, not a reason to skip.
func InCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false" && v != "0"
}

// Require skips the test when a dependency is missing, or fails it in CI.
func Require(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	if InCI() {
		t.Fatalf("missing dependency (CI=true, so this fails): "+format, args...)
	}
	t.Skipf("missing dependency (set CI=true to make this a failure): "+format, args...)
}
