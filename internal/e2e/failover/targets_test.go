package failover

import (
	"os"
	"testing"
)

// target holds a failover run to a latency or throughput target of the
// one-result work that the fleet does not meet in every run yet: on this
// machine, about half the runs of the chaos and failover tests hold them
// (docs/running.md, "What a node failure costs"). make test reports a
// missed target in the test's log and fails on everything else (a second
// final version, a lost or failed job, a process that exits); make
// bench-failover sets FLEET_FAILOVER_TARGETS, runs them several times and
// fails on a missed target too.
func target(t *testing.T, met bool, format string, args ...any) {
	t.Helper()
	switch {
	case met:
	case os.Getenv("FLEET_FAILOVER_TARGETS") != "":
		t.Errorf("target missed: "+format, args...)
	default:
		t.Logf("target missed (make bench-failover holds the run to it): "+format, args...)
	}
}
