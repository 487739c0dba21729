package dispatcher

import (
	"crypto/sha256"
	"crypto/subtle"
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
