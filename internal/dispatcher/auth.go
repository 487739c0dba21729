package dispatcher

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/fleet-dev/fleet/job"
)

// Auth guards the API's /v1/ routes with bearer tokens, client
// certificates, or both. Health, readiness and metrics stay open: they
// reveal nothing about jobs, and probes and scrapers rarely carry either.
//
// A token acts as one tenant, or, given without one, as an operator, who
// may act as any tenant (the Fleet-Tenant header says which; the default
// tenant without it). A client certificate is an operator's.
type Auth struct {
	tokens  [][32]byte // hashed: compared in constant time, whatever their length
	tenants []string   // the tenant of each token; "" for an operator's
	// Certs lets in clients whose certificate the TLS server verified.
	Certs bool
}

// TenantHeader names the tenant an operator's request acts as.
const TenantHeader = "Fleet-Tenant"

// LoadTokens reads bearer tokens from a file, one per line: the token, and
// after a space the tenant it acts as, or nothing for an operator's token.
// Blank lines and lines starting with # are skipped.
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
		tok, tenant, _ := strings.Cut(line, " ")
		tenant = strings.TrimSpace(tenant)
		if len(tok) < 16 {
			return errors.New("api tokens: a token shorter than 16 characters is too easy to guess")
		}
		if tenant != "" && !job.ValidTenant(tenant) {
			return fmt.Errorf("api tokens: tenant %q must be 1 to 64 characters of [A-Za-z0-9_-]", tenant)
		}
		a.tokens = append(a.tokens, sha256.Sum256([]byte(tok)))
		a.tenants = append(a.tenants, tenant)
	}
	if len(a.tokens) == 0 {
		return fmt.Errorf("api tokens: %s holds no token", path)
	}
	return nil
}

// Wrap returns h guarded by the tokens.
func (a *Auth) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			h.ServeHTTP(w, r)
			return
		}
		if p, ok := a.who(r); ok {
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleet"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "a bearer token (Authorization: Bearer <token>) or a client certificate is required"})
	})
}

// principal is who a request acts as: a tenant, or an operator.
type principal struct{ tenant string }

type principalKey struct{}

// who says who r acts as, and whether it may come in at all.
func (a *Auth) who(r *http.Request) (principal, bool) {
	if a.Certs && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return principal{}, true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return principal{}, false
	}
	sum := sha256.Sum256([]byte(tok))
	match := -1
	for i, t := range a.tokens {
		if subtle.ConstantTimeCompare(sum[:], t[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return principal{}, false
	}
	return principal{tenant: a.tenants[match]}, true
}

// TenantOf says which tenant an API request acts as: its token's, or, for
// an operator (and on an open API), the Fleet-Tenant header's, the default
// tenant without one. A token of one tenant asking for another is refused.
func TenantOf(r *http.Request) (string, error) {
	asked := r.Header.Get(TenantHeader)
	p, _ := r.Context().Value(principalKey{}).(principal)
	switch {
	case p.tenant != "" && asked != "" && asked != p.tenant:
		return "", fmt.Errorf("%w: this token acts as tenant %s, not %s", errForbidden, p.tenant, asked)
	case p.tenant != "":
		return p.tenant, nil
	case asked == "":
		return job.DefaultTenant, nil
	case !job.ValidTenant(asked):
		return "", fmt.Errorf("%w: %s %q must be 1 to 64 characters of [A-Za-z0-9_-]", errInvalid, TenantHeader, asked)
	}
	return asked, nil
}

// operatorOnly refuses a request of a tenant's token: pools are paused,
// resumed and shared by operators.
func operatorOnly(r *http.Request) error {
	if p, _ := r.Context().Value(principalKey{}).(principal); p.tenant != "" {
		return fmt.Errorf("%w: tenant %s may not change a pool; an operator's token may", errForbidden, p.tenant)
	}
	return nil
}

// tenantOnly returns the tenant a tenant's token acts as, "" for an
// operator and on an open API.
func tenantOnly(r *http.Request) string {
	p, _ := r.Context().Value(principalKey{}).(principal)
	return p.tenant
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
