package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/ledger"
	"github.com/fleet-dev/fleet/internal/redistest"
)

func TestRedisWithAuthAndTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	cert, key := issue(t, ca, caKey, "redis", true)
	writePEM(t, filepath.Join(dir, "redis.pem"), "CERTIFICATE", cert)
	writeKey(t, filepath.Join(dir, "redis-key.pem"), key)
	const password = "pw-only-the-fleet-knows"
	rs := redistest.Start(t, redistest.WithPassword(password),
		redistest.WithTLS(filepath.Join(dir, "redis.pem"), filepath.Join(dir, "redis-key.pem"), filepath.Join(dir, "ca.pem")))
	if !strings.HasPrefix(rs.URL(), "rediss://") {
		t.Fatalf("url %s", rs.URL())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	trust := capacity.Config{TLS: capacity.TLS{CA: filepath.Join(dir, "ca.pem")}}

	s, err := capacity.Open(rs.URL(), trust)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("with the password and the CA: %v", err)
	}
	r := ledger.New(s, ledger.Config{WorkerID: "tls-worker", Pool: "secure", Backend: "process",
		Slots: 2, Interval: 200 * time.Millisecond})
	r.Start(ctx)
	defer r.Stop(ctx)
	if hbs, err := s.Workers(ctx, "secure"); err != nil || len(hbs) != 1 {
		t.Fatalf("heartbeat over TLS: %v %v", hbs, err)
	}

	wrong, _ := capacity.Open(strings.Replace(rs.URL(), password, "not-"+password, 1), trust)
	defer wrong.Close()
	if err := wrong.Ping(ctx); err == nil || strings.Contains(err.Error(), password) {
		t.Errorf("with a wrong password: %v", err)
	}
	untrusted, _ := capacity.Open(rs.URL(), capacity.Config{})
	defer untrusted.Close()
	if err := untrusted.Ping(ctx); err == nil {
		t.Error("a certificate from an unknown CA was trusted")
	}
	plain, _ := capacity.Open(strings.Replace(rs.URL(), "rediss://", "redis://", 1), capacity.Config{})
	defer plain.Close()
	if err := plain.Ping(ctx); err == nil {
		t.Error("a plain connection was served")
	}
}
