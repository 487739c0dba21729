package docker

import (
	"context"
	"testing"

	"github.com/docker/docker/api/types/container"

	"github.com/fleet-dev/fleet/job"
)

// The two benchmarks run `true` in the test image: once through the bare
// Docker API (create, start, wait, remove), once through the executor's
// Run, which adds the image check, the workspace and its mounts, the
// hardening, the log stream, the inspect and the output collection. Their
// ratio is the executor's overhead per attempt.

func BenchmarkBareDockerCycle(b *testing.B) {
	tb := setup(b, Config{})
	ctx := context.Background()
	cfg := &container.Config{Image: tb.image, Cmd: []string{"true"},
		Labels: map[string]string{LabelManaged: "true", LabelWorkerID: tb.worker}}
	for b.Loop() {
		c, err := tb.cli.ContainerCreate(ctx, cfg, nil, nil, nil, "")
		if err != nil {
			b.Fatal(err)
		}
		if err := tb.cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
			b.Fatal(err)
		}
		results, errs := tb.cli.ContainerWait(ctx, c.ID, container.WaitConditionNotRunning)
		select {
		case r := <-results:
			if r.StatusCode != 0 {
				b.Fatalf("exit code %d", r.StatusCode)
			}
		case err := <-errs:
			b.Fatal(err)
		}
		if err := tb.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExecutorRun(b *testing.B) {
	tb := setup(b, Config{})
	ctx := context.Background()
	for b.Loop() {
		out, err := tb.exec.Run(ctx, tb.task("bench", &job.Request{Command: []string{"true"}}))
		if err != nil {
			b.Fatal(err)
		}
		if out.Status != job.StatusSucceeded {
			b.Fatalf("status %s, failure %+v", out.Status, out.Failure)
		}
	}
}
