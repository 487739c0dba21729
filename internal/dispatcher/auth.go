package dispatcher

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

// Auth guards the API's /v1/ routes with bearer tokens, client
// certificates, or both. Health, readiness and metrics stay open: they
// reveal nothing about jobs, and probes and scrapers rarely carry either.
type Auth struct {
	tokens [][32]byte // hashed: compared in constant time, whatever their length
	// Certs lets in clients whose certificate the TLS server verified.
	Certs bool
}

// LoadTokens reads bearer tokens from a file, one per line; blank lines and
// lines starting with # are skipped.
func (a *Auth) LoadTokens(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("api tokens: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < 16 {
			return errors.New("api tokens: a token shorter than 16 characters is too easy to guess")
		}
		a.tokens = append(a.tokens, sha256.Sum256([]byte(line)))
	}
	if len(a.tokens) == 0 {
		return fmt.Errorf("api tokens: %s holds no token", path)
	}
	return nil
}

// Wrap returns h guarded by the tokens.
func (a *Auth) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") || a.allowed(r) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleet"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "a bearer token (Authorization: Bearer <token>) or a client certificate is required"})
	})
}

func (a *Auth) allowed(r *http.Request) bool {
	if a.Certs && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	match := 0
	for _, t := range a.tokens {
		match |= subtle.ConstantTimeCompare(sum[:], t[:])
	}
	return match == 1
}

// Loopback reports whether addr (host:port) listens on loopback only.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Token checks a bearer token for the console's login: id names the token
// without revealing it, key is a secret derived from it (the same in every
// dispatcher given the token) that signs the console's session cookies.
func (a *Auth) Token(token string) (id string, key []byte, ok bool) {
	sum := sha256.Sum256([]byte(token))
	match := -1
	for i, t := range a.tokens {
		if subtle.ConstantTimeCompare(sum[:], t[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return "", nil, false
	}
	return tokenID(a.tokens[match]), a.tokens[match][:], true
}

// Key returns the key of the token whose id is given, while the token is
// accepted.
func (a *Auth) Key(id string) ([]byte, bool) {
	for _, t := range a.tokens {
		if subtle.ConstantTimeCompare([]byte(tokenID(t)), []byte(id)) == 1 {
			return t[:], true
		}
	}
	return nil, false
}

// Cert reports whether r carries a client certificate the TLS server
// verified, when certificates let clients in.
func (a *Auth) Cert(r *http.Request) bool {
	return a.Certs && r.TLS != nil && len(r.TLS.VerifiedChains) > 0
}

func tokenID(hash [32]byte) string {
	sum := sha256.Sum256(append([]byte("fleet-token-id\x00"), hash[:]...))
	return hex.EncodeToString(sum[:8])
}
