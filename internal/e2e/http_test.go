package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/testport"
)

// freeAddr returns a loopback address no one listens on, for a server the
// test starts (testport: not one the kernel hands out to others meanwhile).
func freeAddr(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", testport.Free(t)) }

func get(t *testing.T, c *http.Client, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestHTTPAPIRequiresATokenWhenConfigured(t *testing.T) {
	f := fleettest.Start(t)
	const token = "s3cret-token-for-the-fleet-api"
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# operators\n"+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	d := fleettest.StartProc(t, "dispatcher", []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL="},
		"--http-addr", addr, "--api-token-file", tokens)
	d.WaitOutput(t, "dispatcher ready", 20*time.Second)
	if strings.Contains(d.Output(), token) {
		t.Error("the token appears in the dispatcher's output")
	}
	base := "http://" + addr
	c := &http.Client{Timeout: 5 * time.Second}
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/v1/jobs/some-job", "", http.StatusUnauthorized},
		{"/v1/jobs/some-job", "wrong-token-of-the-same-size!!", http.StatusUnauthorized},
		{"/v1/jobs/some-job", token, http.StatusNotFound}, // let in: there is no such job
		{"/healthz", "", http.StatusOK},
		{"/readyz", "", http.StatusOK},
	} {
		if got := get(t, c, base+tc.path, tc.token); got != tc.want {
			t.Errorf("GET %s with token %q: %d, want %d", tc.path, tc.token, got, tc.want)
		}
	}
}

func TestHTTPAPIOpenToTheNetworkIsRefused(t *testing.T) {
	f := fleettest.Start(t)
	d := fleettest.StartProc(t, "dispatcher", []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL="},
		"--http-addr", "0.0.0.0:0")
	if !d.Wait(20 * time.Second) {
		t.Fatal("the dispatcher started with an open API on all interfaces")
	}
	if !strings.Contains(d.Output(), "would be open to the network") {
		t.Errorf("no clear reason:\n%s", d.Output())
	}
	// --insecure-http says the operator means it.
	d = fleettest.StartProc(t, "dispatcher", []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL="},
		"--http-addr", "0.0.0.0:0", "--insecure-http")
	d.WaitOutput(t, "dispatcher ready", 20*time.Second)
}

func TestHTTPAPIWithMutualTLS(t *testing.T) {
	f := fleettest.Start(t)
	dir := t.TempDir()
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	serverCert, serverKey := issue(t, ca, caKey, "dispatcher", true)
	writePEM(t, filepath.Join(dir, "server.pem"), "CERTIFICATE", serverCert)
	writeKey(t, filepath.Join(dir, "server-key.pem"), serverKey)
	clientCert, clientKey := issue(t, ca, caKey, "operator", false)

	addr := freeAddr(t)
	d := fleettest.StartProc(t, "dispatcher", []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL="},
		"--http-addr", addr, "--tls-cert", filepath.Join(dir, "server.pem"), "--tls-key", filepath.Join(dir, "server-key.pem"),
		"--tls-client-ca", filepath.Join(dir, "ca.pem"))
	d.WaitOutput(t, "dispatcher ready", 20*time.Second)

	roots := x509.NewCertPool()
	roots.AddCert(ca)
	anonymous := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	if got := get(t, anonymous, "https://"+addr+"/v1/jobs/x", ""); got != http.StatusUnauthorized {
		t.Errorf("a client without a certificate: %d, want 401", got)
	}
	if got := get(t, anonymous, "https://"+addr+"/healthz", ""); got != http.StatusOK {
		t.Errorf("a probe without a certificate: %d, want 200", got)
	}
	withCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots,
		Certificates: []tls.Certificate{{Certificate: [][]byte{clientCert}, PrivateKey: clientKey}}}}}
	if got := get(t, withCert, "https://"+addr+"/v1/jobs/x", ""); got != http.StatusNotFound {
		t.Errorf("client with a certificate: %d, want 404", got)
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleet test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, server bool) ([]byte, *ecdsa.PrivateKey) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKey(t *testing.T, path string, key *ecdsa.PrivateKey) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "EC PRIVATE KEY", der)
}
