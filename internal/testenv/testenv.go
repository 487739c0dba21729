// Package testenv decides what a test does when something it needs (Docker,
// redis-server, a Kubernetes control plane, a tool) is missing: under CI it
// fails, elsewhere it skips. It imports nothing of the fleet, so every test
// helper can use it.
package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// NatsCLI finds the nats CLI (github.com/nats-io/natscli), the client the
// tests use as one that is not the fleet's: FLEET_NATS_CLI, else what
// hack/tools/build.sh built into its cache (FLEET_TOOLS_CACHE, by default
// /var/cache/fleet-tools), else one on the PATH. Without one the test is
// skipped, and fails under CI (.ci/run builds it before the tests).
func NatsCLI(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("FLEET_NATS_CLI"); p != "" {
		return p
	}
	cache := os.Getenv("FLEET_TOOLS_CACHE")
	if cache == "" {
		cache = "/var/cache/fleet-tools"
	}
	if cached := filepath.Join(cache, "bin", "nats"); fileExists(cached) {
		return cached
	}
	p, err := exec.LookPath("nats")
	Require(t, err == nil, "the nats CLI: run hack/tools/build.sh nats, or set FLEET_NATS_CLI (%v)", err)
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ProcessDir returns a new, empty directory <tmp>/<prefix><pid> for what a
// test binary makes once and keeps until it exits (the fleet's binaries, a
// nats-server it built), after removing those of the processes that are
// gone. A test binary has no hook to remove its own as it exits: each left
// up to 200 MB in the temporary folder, and a census of a few hundred runs
// filled 12 GB.
func ProcessDir(prefix string) (string, error) {
	tmp := os.TempDir()
	old, err := filepath.Glob(filepath.Join(tmp, prefix+"*"))
	if err != nil {
		return "", err
	}
	for _, d := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), prefix))
		if err == nil && pid != os.Getpid() && alive(pid) {
			continue
		}
		// Another process's (its pid gone), an older scheme's, or this
		// pid's from a process before it.
		_ = os.RemoveAll(d)
	}
	dir := filepath.Join(tmp, prefix+strconv.Itoa(os.Getpid()))
	return dir, os.Mkdir(dir, 0o755)
}

// alive reports whether a process pid exists.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
