// Package dockertest gives tests the local Docker daemon and a test image
// built on it without a registry: FROM scratch plus testprog, a static Go
// program that echoes, reads inputs, writes outputs, sleeps, ignores
// SIGTERM, allocates memory and exits with a code (see testprog/main.go).
//
// When no daemon answers, tests are skipped if the CI environment variable
// is unset and fail if it is set.
package dockertest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"

	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/internal/testenv"
)

// Image is the tag of the test image.
const Image = "fleet-test/testprog:latest"

// NewClient returns a client of the Docker daemon that DOCKER_HOST names,
// or of the local one, negotiating the API version.
func NewClient() (*client.Client, error) {
	return client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
}

// Ping reports why the daemon does not answer, or nil when it does.
func Ping(ctx context.Context) error {
	cli, err := NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = cli.Ping(ctx)
	return err
}

// Client returns a client of a daemon that answers a ping, closed when the
// test ends. Without one the test is skipped, or fails under CI=true.
func Client(t testing.TB) *client.Client {
	t.Helper()
	err := Ping(context.Background())
	testenv.Require(t, err == nil, "Docker daemon: %v", err)
	cli, err := NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

var built struct {
	once sync.Once
	tag  string
	err  error
}

// TestImage builds the test image on the daemon, once per test binary, and
// returns the tag of this build: Image's repository with a tag named after
// the program's content. Test binaries of other source trees that share
// the daemon may tag Image with another program at any moment; this tag
// keeps naming this one. It requires a daemon as Client does.
func TestImage(t testing.TB) string {
	t.Helper()
	cli := Client(t)
	built.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		built.tag, built.err = BuildImage(ctx, cli, Image)
	})
	if built.err != nil {
		t.Fatalf("build the test image: %v", built.err)
	}
	return built.tag
}

// BuildImage compiles testprog and builds an image of it tagged tag, and
// tagged with tag's repository and a tag named after the program's content,
// which it returns: the program is /testprog, and also /bin/true, where it
// exits 0 at once; the image's default command echoes a greeting.
func BuildImage(ctx context.Context, cli client.APIClient, tag string) (string, error) {
	dir, err := os.MkdirTemp("", "fleet-testprog")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "testprog")
	if err := compile(ctx, bin); err != nil {
		return "", err
	}
	prog, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(prog)
	repo, _, _ := strings.Cut(tag, ":")
	own := repo + ":" + hex.EncodeToString(sum[:6])
	buildCtx, err := tarball(map[string][]byte{
		"Dockerfile": []byte("FROM scratch\nCOPY testprog /testprog\nCOPY testprog /bin/true\nCMD [\"/testprog\", \"echo\", \"hello from testprog\"]\n"),
		"testprog":   prog,
	})
	if err != nil {
		return "", err
	}
	resp, err := cli.ImageBuild(ctx, buildCtx, build.ImageBuildOptions{
		Tags: []string{tag, own}, Remove: true, ForceRemove: true,
		Labels: map[string]string{"fleet.test": "true"},
	})
	if err != nil {
		return "", fmt.Errorf("image build: %w", err)
	}
	defer resp.Body.Close()
	return own, jsonmessage.DisplayJSONMessagesStream(resp.Body, io.Discard, 0, false, nil)
}

// compile builds testprog as a static Linux binary for the daemon's
// architecture, taken to be this one's.
func compile(ctx context.Context, out string) error {
	return executortest.BuildTestProgram(ctx, out, runtime.GOARCH)
}

// tarball makes a build context of files, by name.
func tarball(files map[string][]byte) (io.Reader, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range files {
		hdr := &tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &buf, nil
}
