// Package kubetest gives tests a real Kubernetes control plane: etcd,
// kube-apiserver, kube-controller-manager (with the Job controller) and
// kube-scheduler, all on 127.0.0.1, with kwok playing the kubelet of one fake
// node. No container runs: pods move through their phases according to the
// kwok Stages in hack/k8senv/stages, steered by pod annotations (see the
// Annotation constants).
//
// One control plane is started per test binary, on first use, and shared by
// its tests; each test isolates itself with [Env.NewNamespace]. Stop it from
// TestMain with [Main] (or [Stop]); if the binary dies first, a watchdog
// stops it.
//
// When the environment cannot start, tests are skipped if the CI environment
// variable is unset and fail if it is set.
package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleet-dev/fleet/internal/testenv"
	"github.com/fleet-dev/fleet/internal/testport"
)

// Pod annotations understood by the kwok Stages of hack/k8senv/stages. Set them
// on a Job's pod template, or as labels of the same names (a fleet request's
// labels, which go onto its pod) where the pod has no such annotation.
const (
	// AnnotationDuration is how long a pod runs before it ends, as a Go
	// duration ("1500ms", "1h"). Defaults to 1s.
	AnnotationDuration = "fleet.test/duration"
	// AnnotationExitCode makes the containers of a pod with restartPolicy
	// Never exit with that code ("3"); the pod ends Failed, reason Error.
	AnnotationExitCode = "fleet.test/exit-code"
	// AnnotationOOM set to "true" makes the containers of a pod with
	// restartPolicy Never end OOMKilled with exit code 137; the pod ends Failed.
	AnnotationOOM = "fleet.test/oom"
)

// MissingImageMarker in a container image keeps the pod Pending with the
// container waiting in ErrImagePull, then ImagePullBackOff; or, with
// imagePullPolicy Never, in ErrImageNeverPull.
const MissingImageMarker = "does-not-exist"

// GPUNode is the second node of the control plane: four GPUs of model H100
// (label nvidia.com/gpu.product), tainted gpu=true:NoSchedule.
const GPUNode = "gpu-h100"

// Env is a running control plane.
type Env struct {
	// AdminConfig authenticates as a cluster admin (group system:masters).
	AdminConfig *rest.Config
	// Client is a clientset built from AdminConfig.
	Client kubernetes.Interface
	// KubeconfigPath is an admin kubeconfig with embedded credentials.
	KubeconfigPath string
	// Kubectl is the path of a kubectl of the same version as the server.
	Kubectl string
	// APIServer is the URL of the API server.
	APIServer string
	// RunDir holds the PKI, the kubeconfigs and the component logs (logs/).
	RunDir string

	podLogDir string
	scripts   string
}

var (
	mu       sync.Mutex
	started  bool
	shared   *Env
	startErr error
)

// StartTimeout bounds hack/k8senv/up.sh. Building the binaries is not
// included: run hack/k8senv/build.sh beforehand in CI.
const StartTimeout = 3 * time.Minute

// Start returns the control plane of this test binary, starting it on the
// first call. If it cannot start, the test is skipped when CI is unset and
// fails otherwise.
func Start(t testing.TB) *Env {
	t.Helper()
	mu.Lock()
	if !started {
		started = true
		shared, startErr = start()
	}
	env, err := shared, startErr
	mu.Unlock()
	if err != nil {
		unavailable(t, err)
	}
	return env
}

// Stop stops the control plane if one was started; later calls to Start fail.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		return
	}
	if err := shared.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "kubetest: stop: %v\n", err)
	}
	shared = nil
	startErr = errors.New("kubetest: the environment was stopped")
}

// Main runs the tests and then stops the control plane. Use it as
//
//	func TestMain(m *testing.M) { kubetest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

func unavailable(t testing.TB, err error) {
	t.Helper()
	testenv.Require(t, false, "no Kubernetes test environment: %v", err)
}

func start() (*Env, error) {
	dir, err := scriptDir()
	if err != nil {
		return nil, err
	}
	for _, tool := range []string{"bash", "openssl", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s is required: %w", tool, err)
		}
	}

	if err := exec.Command(filepath.Join(dir, "build.sh"), "--check").Run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubetest: building etcd, Kubernetes v1.37.2 and kwok with hack/k8senv/build.sh; "+
			"a cold build takes about 8 minutes and is cached afterwards")
		build := exec.Command(filepath.Join(dir, "build.sh"))
		build.Stdout = nil
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("hack/k8senv/build.sh: %w", err)
		}
	}

	// up.sh starts the components on ports testport picked and claimed;
	// a process that is not a test binary may still take one in between.
	// A component that finds its port taken makes the whole start fail,
	// and it is tried again on new ports.
	var runDir string
	for try := 1; ; try++ {
		var out string
		runDir, out, err = up(dir)
		if err == nil {
			break
		}
		if try == 3 || !strings.Contains(out, "address already in use") {
			return nil, fmt.Errorf("hack/k8senv/up.sh: %w\n%s", err, tail(out, 60))
		}
		fmt.Fprintf(os.Stderr, "kubetest: a port of the control plane was taken meanwhile; starting it again (try %d)\n", try+1)
	}

	env, err := load(dir, runDir)
	if err != nil {
		_ = runScript(filepath.Join(dir, "down.sh"), runDir)
		return nil, err
	}
	return env, nil
}

// up runs up.sh in a new run directory and returns the directory, or its
// output and why it failed.
func up(dir string) (runDir, output string, err error) {
	runDir, err = os.MkdirTemp("", "fleet-kubetest-")
	if err != nil {
		return "", "", fmt.Errorf("create run directory: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "up.sh"), runDir)
	ports := make([]string, 6)
	for i := range ports {
		p, err := testport.Pick()
		if err != nil {
			return "", "", err
		}
		ports[i] = strconv.Itoa(p)
	}
	cmd.Env = append(os.Environ(), fmt.Sprintf("FLEET_K8S_WATCH_PID=%d", os.Getpid()),
		"FLEET_K8S_PORTS="+strings.Join(ports, " "))
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	begin := time.Now()
	if err := cmd.Run(); err != nil {
		// up.sh stops what it started when it fails, but not when it is
		// killed at the timeout; down.sh also removes the run directory.
		_ = runScript(filepath.Join(dir, "down.sh"), runDir)
		_ = os.RemoveAll(runDir)
		return "", out.String(), err
	}
	fmt.Fprintf(os.Stderr, "kubetest: control plane up in %s (%s)\n", time.Since(begin).Round(100*time.Millisecond), runDir)
	return runDir, "", nil
}

func load(scripts, runDir string) (*Env, error) {
	vars, err := readEnvFile(filepath.Join(runDir, "env"))
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(runDir, "admin.kubeconfig")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	// Tests create many objects quickly; the default 5 QPS would throttle them.
	cfg.QPS = 100
	cfg.Burst = 200
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create clientset: %w", err)
	}
	env := &Env{
		AdminConfig:    cfg,
		Client:         client,
		KubeconfigPath: kubeconfig,
		Kubectl:        filepath.Join(vars["FLEET_K8S_BIN"], "kubectl"),
		APIServer:      vars["FLEET_K8S_API_SERVER"],
		RunDir:         runDir,
		podLogDir:      vars["FLEET_K8S_POD_LOG_DIR"],
		scripts:        scripts,
	}
	return env, nil
}

func (e *Env) stop() error {
	return runScript(filepath.Join(e.scripts, "down.sh"), e.RunDir)
}

func runScript(path string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", filepath.Base(path), err, out)
	}
	return nil
}

// readEnvFile reads the "export NAME=VALUE" lines that up.sh writes.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read environment: %w", err)
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "export ")
		if !ok {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		if strings.ContainsAny(value, `\'"$`) {
			return nil, fmt.Errorf("%s: %s has a quoted value, which kubetest does not parse", path, name)
		}
		vars[name] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	for _, name := range []string{"FLEET_K8S_BIN", "FLEET_K8S_API_SERVER", "FLEET_K8S_POD_LOG_DIR"} {
		if vars[name] == "" {
			return nil, fmt.Errorf("%s: %s is missing", path, name)
		}
	}
	return vars, nil
}

// scriptDir finds hack/k8senv by walking up from the working directory, which
// go test sets to the package's directory.
func scriptDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for dir := wd; ; {
		candidate := filepath.Join(dir, "hack", "k8senv")
		if _, err := os.Stat(filepath.Join(candidate, "up.sh")); err == nil {
			return candidate, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("hack/k8senv/up.sh not found above %s", wd)
		}
		dir = parent
	}
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
