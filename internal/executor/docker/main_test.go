package docker

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/job"
)

// runID tells this run's workers from any other's on the same daemon: each
// test's worker id starts with it.
var runID = "dt-" + job.NewID()[20:]

func TestMain(m *testing.M) {
	// The worker that the conformance suite's recover kills.
	executortest.MaybeOrphan(startOrphan)
	code := m.Run()
	if err := checkNoLeftovers(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// checkNoLeftovers fails the run if a container of its workers is still
// there, and removes it.
func checkNoLeftovers() error {
	if dockertest.Ping(context.Background()) != nil {
		return nil
	}
	cli, err := dockertest.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", LabelManaged+"=true"))})
	if err != nil {
		return fmt.Errorf("list leftover containers: %w", err)
	}
	var left []string
	for _, c := range list {
		if strings.HasPrefix(c.Labels[LabelWorkerID], runID) {
			left = append(left, fmt.Sprintf("%s (worker %s, %s)", c.Names, c.Labels[LabelWorkerID], c.State))
			_ = cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("FAIL: containers left behind: %s", strings.Join(left, "; "))
	}
	return nil
}
