package security_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/testenv"
)

// TestOperatorScripts follows deploy/nats/README.md: gen-nkeys.sh makes
// the keys of the roles, of two tenants and of two pools, add-pool.sh adds
// the second pool and add-tenant.sh the second tenant, and each role
// connects with its seed file and does its first step.
func TestOperatorScripts(t *testing.T) {
	_, err := exec.LookPath("go")
	testenv.Require(t, err == nil, "the go command, to build nk: %v", err)

	dir := t.TempDir()
	out, err := exec.Command("sh", shipped(t, "gen-nkeys.sh"), "-t", "default", "-t", "team-a", dir, "default", "gpu-a100").CombinedOutput()
	if err != nil {
		t.Fatalf("gen-nkeys.sh: %v\n%s", err, out)
	}
	env, err := os.ReadFile(filepath.Join(dir, "nkeys.env"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(env))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || !strings.HasPrefix(v, "U") {
			t.Fatalf("nkeys.env: %q", sc.Text())
		}
		vars[k] = v
		t.Setenv(k, v)
	}
	for _, v := range []string{"FLEET_NKEY_DISPATCHER", "FLEET_NKEY_OPERATOR", "FLEET_NKEY_PRODUCER_DEFAULT",
		"FLEET_NKEY_PRODUCER_TEAM_A", "FLEET_NKEY_WORKER_DEFAULT", "FLEET_NKEY_WORKER_GPU_A100"} {
		if vars[v] == "" {
			t.Fatalf("nkeys.env has no %s:\n%s", v, env)
		}
	}
	k := keys{}
	all := []string{roleDispatcher, roleOperator, roleProducer, roleTenant("team-a"), roleWorker("default"), roleWorker("gpu-a100")}
	for _, role := range all {
		seed := filepath.Join(dir, role+".nk")
		st, err := os.Stat(seed)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", seed, st.Mode().Perm())
		}
		k[role] = seed
	}

	s := startServer(t, configured(t, []string{"gpu-a100"}, []string{"team-a"}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	disp := connectAs(t, s.url(), k, roleDispatcher)
	djs, _ := jetstream.New(disp.Conn)
	if err := queue.Setup(ctx, djs, queue.Config{}, nil); err != nil {
		t.Fatalf("dispatcher: %v", err)
	}
	for _, pool := range []string{"default", "gpu-a100"} {
		w := connectAs(t, s.url(), k, roleWorker(pool))
		wjs, _ := jetstream.New(w.Conn)
		if err := queue.WorkerPoolStream(ctx, wjs, queue.Config{}, pool, nil); err != nil {
			t.Fatalf("worker of %s: %v", pool, err)
		}
		if _, err := queue.BindQueue(ctx, wjs, queue.Config{}, pool, queue.QueueKey{Priority: 3, Tenant: "team-a"}); err != nil {
			t.Fatalf("worker of %s binds to a queue: %v", pool, err)
		}
	}
	// Each tenant's producer asks for its uploads bucket, which a
	// dispatcher makes; the operator asks whether a pool is paused.
	d, err := dispatcher.New(disp.Conn, dispatcher.Config{Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatalf("dispatcher: %v", err)
	}
	defer func() { _ = d.Stop(context.Background()) }()
	for _, tenant := range []string{"default", "team-a"} {
		c, err := client.New(connectAs(t, s.url(), k, roleTenant(tenant)).Conn, client.WithTenant(tenant))
		if err != nil {
			t.Fatal(err)
		}
		if ref, err := c.Upload(ctx, "hello.txt", strings.NewReader("hi")); err != nil || ref.Bucket != "fleet-uploads-"+tenant {
			t.Fatalf("tenant %s uploads: %+v, %v", tenant, ref, err)
		}
	}
	oc, err := client.New(connectAs(t, s.url(), k, roleOperator).Conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oc.Pool(ctx, "gpu-a100"); err != nil {
		t.Fatalf("operator: %v", err)
	}
	if v := s.log.violations(); len(v) > 0 {
		t.Fatalf("refused: %q", v)
	}
}
