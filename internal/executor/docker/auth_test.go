package docker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/docker/docker/api/types/registry"

	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/job"
)

func TestRegistryHost(t *testing.T) {
	for in, want := range map[string]string{
		"https://index.docker.io/v1/":  "docker.io",
		"registry.example.com:5000":    "registry.example.com:5000",
		"https://ghcr.io":              "ghcr.io",
		"http://127.0.0.1:5000/v2/":    "127.0.0.1:5000",
		"registry-1.docker.io":         "docker.io",
		"quay.io/some/path/is/ignored": "quay.io",
	} {
		if got := registryHost(in); got != want {
			t.Errorf("registryHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRegistryAuthsFromTheConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	userpass := base64.StdEncoding.EncodeToString([]byte("robot:s3cret:with:colons"))
	write := func(doc string) {
		if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"auths": {"https://index.docker.io/v1/": {"auth": "` + userpass + `"}, "ghcr.io": {"identitytoken": "tok"}}}`)
	a, err := loadAuths(cfg)
	if err != nil {
		t.Fatal(err)
	}
	decode := func(ref string) registry.AuthConfig {
		t.Helper()
		enc, err := a.For(context.Background(), ref)
		if err != nil {
			t.Fatal(err)
		}
		var c registry.AuthConfig
		if enc != "" {
			raw, err := base64.URLEncoding.DecodeString(enc)
			if err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal(raw, &c)
		}
		return c
	}
	if c := decode("alpine:3"); c.Username != "robot" || c.Password != "s3cret:with:colons" || c.ServerAddress != "https://index.docker.io/v1/" {
		t.Errorf("Docker Hub: %+v", c)
	}
	if c := decode("ghcr.io/acme/app:1"); c.IdentityToken != "tok" {
		t.Errorf("ghcr.io: %+v", c)
	}
	if c := decode("quay.io/acme/app:1"); c != (registry.AuthConfig{}) {
		t.Errorf("a registry without credentials: %+v", c)
	}

	// A credential helper, run as docker-credential-<name> get.
	bin := t.TempDir()
	helper := "#!/bin/sh\nread server\n[ \"$server\" = quay.io ] || { echo 'credentials not found in native keychain'; exit 1; }\n" +
		`echo '{"ServerURL": "quay.io", "Username": "helper-user", "Secret": "helper-secret"}'` + "\n"
	if err := os.WriteFile(filepath.Join(bin, "docker-credential-fleettest"), []byte(helper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	write(`{"credHelpers": {"quay.io": "fleettest"}, "credsStore": "fleettest"}`)
	if a, err = loadAuths(cfg); err != nil {
		t.Fatal(err)
	}
	if c := decode("quay.io/acme/app:1"); c.Username != "helper-user" || c.Password != "helper-secret" {
		t.Errorf("quay.io from the helper: %+v", c)
	}
	if c := decode("ghcr.io/acme/app:1"); c != (registry.AuthConfig{}) {
		t.Errorf("a registry the helper does not know: %+v", c)
	}

	for _, bad := range []string{`{"auths": {"x.io": {"auth": "bm90LWEtcGFpcg=="}}}`, `{"auths": `, `[1]`} {
		write(bad)
		_, err := loadAuths(cfg)
		if err == nil || strings.Contains(err.Error(), "bm90") {
			t.Errorf("config %s: %v, want an error that quotes nothing of it", bad, err)
		}
	}
}

// TestPullsPresentTheConfigsCredentials: the daemon pulls from a registry
// that asks for credentials with those of the worker's Docker config. The
// registry here has no image: it records what the daemon presents.
func TestPullsPresentTheConfigsCredentials(t *testing.T) {
	dockertest.Client(t)
	var mu sync.Mutex
	var seen []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") == "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="fleet-test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		if r.URL.Path == "/v2/" {
			return
		}
		http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"no such image"}]}`, http.StatusNotFound)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	host := ln.Addr().String()
	cfg := filepath.Join(t.TempDir(), "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte("puller:pull-secret"))
	if err := os.WriteFile(cfg, []byte(`{"auths": {"`+host+`": {"auth": "`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	b := setup(t, Config{DockerConfig: cfg})
	_, err = b.exec.image(context.Background(), host+"/private/app:1", job.PullAlways, nil)
	if err == nil {
		t.Fatal("a pull of an image the registry does not have succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	want := "Basic " + auth
	found := false
	for _, a := range seen {
		found = found || a == want
	}
	if !found {
		t.Errorf("the registry saw Authorization %q, want %q", seen, want)
	}
	if strings.Contains(b.logs.String(), "pull-secret") || strings.Contains(err.Error(), "pull-secret") {
		t.Error("the registry password reached a log or an error")
	}
}
