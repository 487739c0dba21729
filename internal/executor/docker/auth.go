package docker

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/distribution/reference"
	"github.com/docker/docker/api/types/registry"
)

// Registry credentials come from a Docker client configuration file
// (--docker-config, the config.json that docker login writes), never from
// a request: its "auths" entries ("auth", or "username" and "password", or
// an "identitytoken"), and the credential helpers it names ("credHelpers"
// per registry, "credsStore" for the rest), which are run as
// docker-credential-<name> get. Credentials are never logged.

// registryAuths are the credentials of a Docker configuration file.
type registryAuths struct {
	path    string
	auths   map[string]authEntry // by registry host
	helpers map[string]string    // by registry host
	store   string
}

type authEntry struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// loadAuths reads a Docker configuration file; none without a path.
func loadAuths(path string) (*registryAuths, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("docker config: %w", err)
	}
	var doc struct {
		Auths       map[string]authEntry `json:"auths"`
		CredHelpers map[string]string    `json:"credHelpers"`
		CredsStore  string               `json:"credsStore"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		// The decoder's message may quote the file: say only where.
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("docker config %s: malformed JSON at byte %d", path, se.Offset)
		}
		return nil, fmt.Errorf("docker config %s: not a Docker client configuration", path)
	}
	a := &registryAuths{path: path, auths: map[string]authEntry{}, helpers: map[string]string{}, store: doc.CredsStore}
	for k, v := range doc.Auths {
		if v.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(v.Auth)
			user, pass, ok := strings.Cut(string(raw), ":")
			if err != nil || !ok {
				return nil, fmt.Errorf("docker config %s: the auth of %s is not base64 of user:password", path, registryHost(k))
			}
			v.Username, v.Password = user, pass
		}
		a.auths[registryHost(k)] = v
	}
	for k, v := range doc.CredHelpers {
		a.helpers[registryHost(k)] = v
	}
	return a, nil
}

// registryHost turns a key of the configuration ("https://index.docker.io/v1/",
// "registry.example.com:5000") into a registry host as image references
// name it ("docker.io", "registry.example.com:5000").
func registryHost(key string) string {
	h := key
	for _, p := range []string{"https://", "http://"} {
		h = strings.TrimPrefix(h, p)
	}
	h, _, _ = strings.Cut(h, "/")
	switch h {
	case "index.docker.io", "registry-1.docker.io":
		return "docker.io"
	}
	return h
}

// For returns the encoded credentials for pulling ref, or "" for none.
func (a *registryAuths) For(ctx context.Context, ref string) (string, error) {
	if a == nil {
		return "", nil
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", nil // the pull says what is wrong with it
	}
	host := reference.Domain(named)
	server := host
	if host == "docker.io" {
		server = "https://index.docker.io/v1/"
	}
	if e, ok := a.auths[host]; ok && (e.Username != "" || e.IdentityToken != "" || e.RegistryToken != "") {
		return registry.EncodeAuthConfig(registry.AuthConfig{Username: e.Username, Password: e.Password,
			IdentityToken: e.IdentityToken, RegistryToken: e.RegistryToken, ServerAddress: server})
	}
	helper := a.helpers[host]
	if helper == "" {
		helper = a.store
	}
	if helper == "" {
		return "", nil
	}
	user, secret, err := runHelper(ctx, helper, server)
	if err != nil {
		return "", fmt.Errorf("credentials for %s from docker-credential-%s: %w", host, helper, err)
	}
	if user == "" && secret == "" {
		return "", nil
	}
	c := registry.AuthConfig{Username: user, Password: secret, ServerAddress: server}
	if user == "<token>" {
		c = registry.AuthConfig{IdentityToken: secret, ServerAddress: server}
	}
	return registry.EncodeAuthConfig(c)
}

// runHelper asks a credential helper for a registry's credentials. A
// registry it knows nothing of gives none.
func runHelper(ctx context.Context, helper, server string) (user, secret string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker-credential-"+helper, "get")
	cmd.Stdin = strings.NewReader(server)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stdout.String()+stderr.String(), "credentials not found") {
			return "", "", nil
		}
		return "", "", fmt.Errorf("%w", err) // its output may hold secrets: not quoted
	}
	var out struct{ Username, Secret string }
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return "", "", errors.New("its answer is not JSON")
	}
	return out.Username, out.Secret, nil
}
