package fleettest

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/artifact"
)

// Artifacts returns the fleet's object store on a connection of its own,
// for a worker's Config.Artifacts or to look at what jobs stored.
func (f *Fleet) Artifacts(t testing.TB) *artifact.Store {
	t.Helper()
	js, err := jetstream.New(f.NATS.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return artifact.New(js, artifact.Config{Names: f.Queue.Names})
}
