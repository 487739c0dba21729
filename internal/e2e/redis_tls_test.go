package e2e

import (
	"context"
	"crypto/rand"
	"crypto/x509"
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

// The Sentinel and Cluster forms over TLS with passwords: the servers'
// password apart from the URL (as from FLEET_REDIS_PASSWORD) or in it, and
// the Sentinels' own password apart. A worker's heartbeat goes through; a
// wrong password, a wrong Sentinel password, an unknown CA or plain TCP
// do not, and no error shows a password.
func TestRedisSentinelAndClusterWithAuthAndTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	cert, key := issue(t, ca, caKey, "redis", true)
	writePEM(t, filepath.Join(dir, "redis.pem"), "CERTIFICATE", cert)
	writeKey(t, filepath.Join(dir, "redis-key.pem"), key)
	withTLS := redistest.WithTLS(filepath.Join(dir, "redis.pem"), filepath.Join(dir, "redis-key.pem"), filepath.Join(dir, "ca.pem"))
	trust := capacity.TLS{CA: filepath.Join(dir, "ca.pem")}
	const password, sentinelPassword = "servers-pw-4-tls", "sentinels-pw-4-tls"

	heartbeatGoesThrough := func(t *testing.T, url string, cfg capacity.Config) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := capacity.Open(url, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("with the passwords and the CA: %v", err)
		}
		r := ledger.New(s, ledger.Config{WorkerID: "tls-worker", Pool: "secure", Backend: "process",
			Slots: 2, Interval: 200 * time.Millisecond})
		r.Start(ctx)
		defer r.Stop(ctx)
		if hbs, err := s.Workers(ctx, "secure"); err != nil || len(hbs) != 1 {
			t.Fatalf("heartbeat over TLS: %v %v", hbs, err)
		}
	}
	refused := func(t *testing.T, what, url string, cfg capacity.Config) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := capacity.Open(url, cfg)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer s.Close()
		err = s.Ping(ctx)
		if err == nil {
			t.Errorf("%s: Redis answered", what)
		} else if msg := err.Error(); strings.Contains(msg, password) || strings.Contains(msg, sentinelPassword) {
			t.Errorf("%s: the error shows a password: %v", what, err)
		}
	}

	t.Run("sentinel", func(t *testing.T) {
		st := redistest.StartSentinel(t, withTLS, redistest.WithPassword(password), redistest.WithSentinelPassword(sentinelPassword))
		url := st.URL()
		if !strings.HasPrefix(url, "rediss+sentinel://") {
			t.Fatalf("url %s", url)
		}
		ok := capacity.Config{TLS: trust, Password: password, SentinelPassword: sentinelPassword}
		heartbeatGoesThrough(t, url, ok)
		bad := ok
		bad.SentinelPassword = "not-" + sentinelPassword
		refused(t, "a wrong Sentinel password", url, bad)
		bad = ok
		bad.Password = "not-" + password
		refused(t, "a wrong server password", url, bad)
		bad = ok
		bad.TLS = capacity.TLS{}
		refused(t, "an unknown CA", url, bad)
		refused(t, "plain TCP", strings.Replace(url, "rediss+", "redis+", 1), ok)
	})
	t.Run("cluster", func(t *testing.T) {
		// Cluster nodes authenticate each other on the cluster bus: their
		// certificate serves as a client's too.
		cert, key := issue(t, ca, caKey, "redis-node", true)
		node, err := x509.ParseCertificate(cert)
		if err != nil {
			t.Fatal(err)
		}
		node.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		if cert, err = x509.CreateCertificate(rand.Reader, node, ca, &key.PublicKey, caKey); err != nil {
			t.Fatal(err)
		}
		writePEM(t, filepath.Join(dir, "node.pem"), "CERTIFICATE", cert)
		writeKey(t, filepath.Join(dir, "node-key.pem"), key)
		withTLS := redistest.WithTLS(filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem"), filepath.Join(dir, "ca.pem"))
		cl := redistest.StartCluster(t, 3, withTLS, redistest.WithPassword(password))
		url := cl.URL()
		if !strings.HasPrefix(url, "rediss+cluster://:"+password+"@") {
			t.Fatalf("url %s", url)
		}
		heartbeatGoesThrough(t, url, capacity.Config{TLS: trust})
		refused(t, "a wrong password", strings.Replace(url, password, "not-"+password, 1), capacity.Config{TLS: trust})
		refused(t, "an unknown CA", url, capacity.Config{})
		refused(t, "plain TCP", strings.Replace(url, "rediss+", "redis+", 1), capacity.Config{TLS: trust})
		if _, err := capacity.Open(url, capacity.Config{TLS: trust, Password: password}); err == nil ||
			strings.Contains(err.Error(), password) {
			t.Errorf("a password in the URL and another apart: %v", err)
		}
	})
}
