package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/testenv"
)

// TestDemo runs make demo's script with this source's binaries: the demo
// fails unless each example ends as its name says. It uses the demo's fixed
// ports (14222, 16379, 18080).
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "scripts/demo.sh")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "FLEET_DEMO_BIN="+filepath.Dir(fleettest.Binary(t, "fleetctl")))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/demo.sh: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "the console: http://127.0.0.1:18080/ui/") {
		t.Errorf("the demo does not print the console's URL:\n%s", out)
	}
	if !strings.Contains(string(out), "the console lists them") {
		t.Errorf("the demo does not show its jobs in the console:\n%s", out)
	}
	if !strings.Contains(string(out), "hello, fleet") {
		t.Errorf("the demo does not show the first job's output:\n%s", out)
	}
	// Under CI, Docker is there, and the demo must use it.
	testenv.Require(t, !testenv.InCI() || strings.Contains(string(out), "--executor docker"),
		"the demo ran without Docker:\n%s", out)
}
