package doctest_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/pkg/jsonmessage"

	"github.com/fleet-dev/fleet/internal/dockertest"
)

// busyboxImage is the image the README's Docker job names.
const busyboxImage = "busybox:1.36"

// busybox makes sure the local Docker daemon has busybox:1.36, without a
// registry: a daemon that has it keeps it; else a stand-in is built and
// tagged so, FROM scratch with testdata/busybox (echo, true, false, sleep,
// cat), labelled fleet.doctest=busybox-stand-in. Without a daemon the test
// is skipped, or fails under CI=true.
func busybox(t *testing.T) {
	t.Helper()
	cli := dockertest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if img, err := cli.ImageInspect(ctx, busyboxImage); err == nil {
		if img.Config != nil && img.Config.Labels["fleet.doctest"] != "" {
			t.Logf("%s: the stand-in of an earlier run", busyboxImage)
		} else {
			t.Logf("%s: the daemon's own", busyboxImage)
		}
		return
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(dir, "busybox"), "./testdata/busybox")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the busybox stand-in: %v\n%s", err, out)
	}
	prog, err := os.ReadFile(filepath.Join(dir, "busybox"))
	if err != nil {
		t.Fatal(err)
	}
	dockerfile := "FROM scratch\n"
	for _, name := range []string{"echo", "true", "false", "sleep", "cat"} {
		dockerfile += "COPY busybox /bin/" + name + "\n"
	}
	dockerfile += "CMD [\"/bin/echo\", \"the fleet tests' stand-in for busybox\"]\n"
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range map[string][]byte{"Dockerfile": []byte(dockerfile), "busybox": prog} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.ImageBuild(ctx, &buf, build.ImageBuildOptions{
		Tags: []string{busyboxImage}, Remove: true, ForceRemove: true,
		Labels: map[string]string{"fleet.test": "true", "fleet.doctest": "busybox-stand-in"},
	})
	if err != nil {
		t.Fatalf("build the busybox stand-in image: %v", err)
	}
	defer resp.Body.Close()
	if err := jsonmessage.DisplayJSONMessagesStream(resp.Body, io.Discard, 0, false, nil); err != nil {
		t.Fatalf("build the busybox stand-in image: %v", err)
	}
	t.Logf("%s: a stand-in built FROM scratch (no registry)", busyboxImage)
}
