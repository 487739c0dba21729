package dockertest_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/fleet-dev/fleet/internal/dockertest"
)

func TestTestImageRunsTestprog(t *testing.T) {
	cli := dockertest.Client(t)
	image := dockertest.TestImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, tc := range []struct {
		cmd            []string
		code           int64
		stdout, stderr string
	}{
		{nil, 0, "hello from testprog\n", ""},
		{[]string{"true"}, 0, "", ""},
		{[]string{"/testprog", "echo", "out", "stderr", "err", "exit", "7"}, 7, "out\n", "err\n"},
		{[]string{"/testprog", "bogus"}, 100, "", "testprog: usage: step \"bogus\" is unknown or misses arguments\n"},
	} {
		c, err := cli.ContainerCreate(ctx, &container.Config{Image: image, Cmd: tc.cmd}, nil, nil, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true})
		results, errs := cli.ContainerWait(ctx, c.ID, container.WaitConditionNextExit)
		if err := cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-results:
			if r.StatusCode != tc.code {
				t.Errorf("%q exited with %d, want %d", tc.cmd, r.StatusCode, tc.code)
			}
		case err := <-errs:
			t.Fatal(err)
		}
		logs, err := cli.ContainerLogs(ctx, c.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		_, _ = stdcopy.StdCopy(&stdout, &stderr, logs)
		logs.Close()
		if stdout.String() != tc.stdout || stderr.String() != tc.stderr {
			t.Errorf("%q: stdout %q, stderr %q; want %q, %q", tc.cmd, stdout.String(), stderr.String(), tc.stdout, tc.stderr)
		}
	}
}
