package deploytest

import (
	"bytes"
	"cmp"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	kubetest.Stop()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// repoRoot is the main module's folder: two levels up from this package.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// toolsBin is where hack/tools/build.sh puts helm and docker-compose.
func toolsBin() string {
	return filepath.Join(cmp.Or(os.Getenv("FLEET_TOOLS_CACHE"), "/var/cache/fleet-tools"), "bin")
}

var (
	toolsMu sync.Mutex
	found   = map[string][]string{}
)

// findTool returns the first candidate command whose `version` output passes
// ok, remembering the answer for the test binary.
func findTool(name string, candidates [][]string, ok func(version string) bool) []string {
	toolsMu.Lock()
	defer toolsMu.Unlock()
	if c, done := found[name]; done {
		return c
	}
	found[name] = nil
	for _, c := range candidates {
		if len(c) == 0 || c[0] == "" {
			continue
		}
		path, err := exec.LookPath(c[0])
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, path, append(c[1:], "version", "--short")...).Output()
		cancel()
		if err == nil && ok(strings.TrimSpace(string(out))) {
			found[name] = append([]string{path}, c[1:]...)
			break
		}
	}
	return found[name]
}

// helm returns a helm v3 binary. Without one the test is skipped, or fails
// under CI.
func helm(t testing.TB) string {
	t.Helper()
	c := findTool("helm", [][]string{
		{os.Getenv("FLEET_HELM")},
		{filepath.Join(toolsBin(), "helm")},
		{"helm"},
	}, func(v string) bool { return strings.HasPrefix(v, "v3.") })
	testenv.Require(t, c != nil, "helm v3: build it with hack/tools/build.sh helm (or set FLEET_HELM)")
	return c[0]
}

// compose returns the command of Docker Compose v2 or later: the binary
// hack/tools/build.sh builds, or the docker CLI plugin. Compose v1
// (docker-compose 1.x, Python) does not know this file's syntax.
func compose(t testing.TB) []string {
	t.Helper()
	c := findTool("compose", [][]string{
		{os.Getenv("FLEET_COMPOSE")},
		{filepath.Join(toolsBin(), "docker-compose")},
		{"docker", "compose"},
		{"docker-compose"},
	}, func(v string) bool {
		v = strings.TrimPrefix(v, "v")
		major, _, _ := strings.Cut(v, ".")
		return major != "" && major != "0" && major != "1" && strings.Trim(major, "0123456789") == ""
	})
	testenv.Require(t, c != nil, "Docker Compose v2: build it with hack/tools/build.sh docker-compose (or set FLEET_COMPOSE)")
	return c
}

// toolEnv is the environment of the tools: this process's, less the
// variables that would change what they render (compose interpolates
// FLEET_*, OTEL_* and *_IMAGE), with helm's folders in a temporary one.
func toolEnv(t testing.TB, extra ...string) []string {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FLEET_") || strings.HasPrefix(k, "OTEL_") || strings.HasSuffix(k, "_IMAGE") ||
			strings.HasPrefix(k, "HELM_") || strings.HasPrefix(k, "COMPOSE_") || k == "KUBECONFIG" {
			continue
		}
		env = append(env, kv)
	}
	home := t.TempDir()
	env = append(env, "HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	return append(env, extra...)
}

// run runs a command and returns its standard output; it fails the test,
// with both outputs, if the command fails.
func run(t testing.TB, dir string, env []string, stdin []byte, argv ...string) string {
	t.Helper()
	out, errOut, err := tryRun(dir, env, stdin, argv...)
	if err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(argv, " "), err, tail(out, 4000), tail(errOut, 4000))
	}
	return out
}

// tryRun runs a command with a timeout of two minutes.
func tryRun(dir string, env []string, stdin []byte, argv ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
