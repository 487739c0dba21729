package deploytest

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

const clusterFile = "deploy/compose/cluster.yml"

// TestComposeClusterConfig renders docker-compose.yml with
// deploy/compose/cluster.yml and checks the cluster it describes: three NATS
// servers, each with its own name and volume, routed to each other; two
// dispatchers that ask for three replicas; every fleet process seeded with
// all three servers.
func TestComposeClusterConfig(t *testing.T) {
	p := composeConfig(t, toolEnv(t), "-f", filepath.Join(repoRoot(t), clusterFile))
	for _, name := range []string{"nats", "nats-2", "nats-3", "redis", "dispatcher", "dispatcher-2", "worker-1", "worker-2"} {
		if _, ok := p.Services[name]; !ok {
			t.Fatalf("no service %s in %v", name, p.Services)
		}
	}
	names := map[string]bool{}
	volumes := map[string]bool{}
	for _, n := range []string{"nats", "nats-2", "nats-3"} {
		s := p.Services[n]
		names[s.env("NATS_SERVER_NAME")] = true
		var conf bool
		for _, v := range s.Volumes {
			if v.Target == "/data" && v.Type == "volume" {
				volumes[v.Source] = true
			}
			conf = conf || (v.Target == "/etc/nats/nats.conf" && strings.HasSuffix(v.Source, "deploy/compose/nats-cluster.conf") && v.ReadOnly)
		}
		if !conf {
			t.Errorf("%s does not read deploy/compose/nats-cluster.conf: %+v", n, s.Volumes)
		}
		if s.Healthcheck == nil || len(s.Healthcheck.Test) == 0 {
			t.Errorf("%s has no health check", n)
		}
		for _, port := range s.Ports {
			if n != "nats" || port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %d on %q: only the first server, on loopback", n, port.Target, port.HostIP)
			}
		}
	}
	if len(names) != 3 || names[""] {
		t.Errorf("server names %v: want three, each its own", names)
	}
	if len(volumes) != 3 {
		t.Errorf("JetStream volumes %v: want three, each its own", volumes)
	}

	// The configuration, read by the NATS server's own code, for each name.
	for name := range names {
		t.Setenv("NATS_SERVER_NAME", name)
		opts, err := server.ProcessConfigFile(filepath.Join(repoRoot(t), "deploy", "compose", "nats-cluster.conf"))
		if err != nil {
			t.Fatal(err)
		}
		var routes []string
		for _, r := range opts.Routes {
			routes = append(routes, r.Host)
		}
		slices.Sort(routes)
		if opts.ServerName != name || opts.Cluster.Name == "" || opts.Cluster.Port != 6222 ||
			!slices.Equal(routes, []string{"nats-2:6222", "nats-3:6222", "nats:6222"}) {
			t.Errorf("nats-cluster.conf as %s: name %q, cluster %q on %d, routes %v", name, opts.ServerName, opts.Cluster.Name, opts.Cluster.Port, routes)
		}
		if !opts.JetStream || opts.StoreDir != "/data" || opts.HTTPPort != 8222 || opts.MaxPayload != 8<<20 || !opts.SyncAlways {
			t.Errorf("nats-cluster.conf: jetstream %t in %q, monitoring %d, max payload %d, sync always %t",
				opts.JetStream, opts.StoreDir, opts.HTTPPort, opts.MaxPayload, opts.SyncAlways)
		}
	}

	seeds := "nats://nats:4222,nats://nats-2:4222,nats://nats-3:4222"
	for _, n := range []string{"dispatcher", "dispatcher-2", "worker-1", "worker-2"} {
		if got := p.Services[n].env("FLEET_NATS_URL"); got != seeds {
			t.Errorf("%s: FLEET_NATS_URL %q, want %q", n, got, seeds)
		}
	}
	for _, n := range []string{"dispatcher", "dispatcher-2"} {
		d := p.Services[n]
		if d.env("FLEET_REPLICAS") != "3" || !slices.Equal(d.Command, []string{"dispatcher"}) {
			t.Errorf("%s: FLEET_REPLICAS %q, command %v", n, d.env("FLEET_REPLICAS"), d.Command)
		}
		for _, dep := range []string{"nats", "nats-2", "nats-3", "redis"} {
			if d.DependsOn[dep].Condition != "service_healthy" {
				t.Errorf("%s depends on %+v, want %s healthy", n, d.DependsOn, dep)
			}
		}
		if d.Healthcheck == nil || d.env("FLEET_API_TOKEN_FILE") == "" {
			t.Errorf("%s: health check %v, token file %q", n, d.Healthcheck, d.env("FLEET_API_TOKEN_FILE"))
		}
	}
	if ports := p.Services["dispatcher-2"].Ports; len(ports) != 0 {
		t.Errorf("dispatcher-2 publishes %+v: the host port is the first dispatcher's", ports)
	}
}

// clusterStandIns stands in for the three NATS servers as standIns does
// for one: `dispatcher --embedded` of the image under test, whose NATS server
// reads deploy/compose/nats-cluster.conf (name, cluster, routes) as
// nats-server would.
const clusterStandIns = standIns + `  nats-2:
    image: ${FLEET_IMAGE}
    user: "0:0"
    command: ["dispatcher", "--embedded", "--nats-server-config", "/etc/nats/nats.conf",
              "--subject-prefix", "standin", "--http-addr", "127.0.0.1:8081"]
    environment:
      FLEET_NATS_URL: nats://0.0.0.0:4222
      FLEET_REDIS_URL: redis://127.0.0.1:6380/0
      FLEET_DATA_DIR: /data
    healthcheck:
      test: ["CMD", "fleetctl", "capacity", "--http-addr", "127.0.0.1:8081"]
      interval: 1s
      start_period: 0s
  nats-3:
    image: ${FLEET_IMAGE}
    user: "0:0"
    command: ["dispatcher", "--embedded", "--nats-server-config", "/etc/nats/nats.conf",
              "--subject-prefix", "standin", "--http-addr", "127.0.0.1:8081"]
    environment:
      FLEET_NATS_URL: nats://0.0.0.0:4222
      FLEET_REDIS_URL: redis://127.0.0.1:6380/0
      FLEET_DATA_DIR: /data
    healthcheck:
      test: ["CMD", "fleetctl", "capacity", "--http-addr", "127.0.0.1:8081"]
      interval: 1s
      start_period: 0s
  dispatcher-2:
    healthcheck:
      interval: 1s
      start_period: 0s
`

// TestComposeClusterUpRunsAJob starts docker-compose.yml with
// deploy/compose/cluster.yml: three NATS servers (stood in for as in
// TestComposeUpRunsAJob, with the cluster's configuration), two dispatchers
// started together on the fresh cluster, two workers. Both dispatchers
// become healthy, the streams have three replicas, a job runs; then one
// NATS server is killed and another job runs.
func TestComposeClusterUpRunsAJob(t *testing.T) {
	f := composeUp(t, []string{clusterFile}, clusterStandIns)
	f.waitWorkers(t)
	f.runJob(t, "cluster")

	js, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"FLEET_INTAKE", "FLEET_POOL_default", "FLEET_EVENTS", "KV_fleet-keys"} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Errorf("%s: %d replicas, cluster %+v", name, info.Config.Replicas, info.Cluster)
		}
	}

	// One NATS server dies (not the one the host reaches): the fleet goes on.
	if _, stderr, err := f.run("kill", "nats-3"); err != nil {
		t.Fatalf("compose kill nats-3: %v\n%s", err, stderr)
	}
	f.runJob(t, "after-kill")
	out, _, err := f.run("ps", "--status", "running", "--services")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"dispatcher", "dispatcher-2", "worker-1", "worker-2"} {
		if !slices.Contains(strings.Fields(out), s) {
			t.Errorf("%s is not running after a NATS server died: %s", s, out)
		}
	}
}
