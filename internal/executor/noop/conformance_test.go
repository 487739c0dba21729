package noop

import (
	"testing"

	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/job"
)

// TestConformance holds the noop executor to what of the executors'
// contract it can meet: it runs nothing, so only a success applies.
func TestConformance(t *testing.T) {
	const runsNothing = "it runs nothing: every attempt succeeds at once"
	executortest.Run(t, executortest.Backend{
		Name: "noop",
		Lacks: map[executortest.Ability]string{
			executortest.Programs:       runsNothing,
			executortest.SeparateStderr: runsNothing,
			executortest.OOM:            runsNothing,
			executortest.Container:      runsNothing,
			executortest.ReadOnlyInputs: runsNothing,
			executortest.Recover:        "nothing of an attempt outlives it",
			executortest.Validate:       "it can run any request",
		},
		New: func(t *testing.T, c *executortest.Case) *executortest.Instance {
			return &executortest.Instance{
				Executor: Executor{},
				Complete: func(*job.Request) {},
				Left:     func(testing.TB) []string { return nil },
			}
		},
	})
}
