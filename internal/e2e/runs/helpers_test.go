package runs_test

import (
	"errors"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fleet-dev/fleet/client"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	goleak.VerifyTestMain(m)
}

func mustWrite(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func errAs[T error](err error, target *T) bool { return errors.As(err, target) }

func errorsIsNotFound(err error) bool { return errors.Is(err, client.ErrNotFound) }
