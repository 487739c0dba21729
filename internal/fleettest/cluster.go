package fleettest

import (
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/natstest"
)

// ClusterFleet starts a three-node cluster and two dispatcher processes
// with streams of three replicas, and returns the cluster and the
// environment for the fleet's processes (no Redis).
func ClusterFleet(t *testing.T) (*natstest.Cluster, []string) {
	t.Helper()
	Binary(t, "worker")
	c := natstest.RunCluster(t, 3)
	c.WaitReady(t, 30*time.Second)
	env := []string{"FLEET_NATS_URL=" + c.URLs(), "FLEET_REDIS_URL=", "FLEET_DATA_DIR=" + t.TempDir(), "FLEET_HTTP_ADDR=127.0.0.1:0"}
	for range 2 {
		StartProc(t, "dispatcher", env, "--replicas", "3").WaitOutput(t, "dispatcher ready", 30*time.Second)
	}
	return c, env
}
