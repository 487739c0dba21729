package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"net"
	"net/http"
	"strings"
	"time"
)

// Auth is how the dispatcher's API decides who is let in, which the
// console follows: the same bearer tokens, which a browser gives once in
// the login form, or the same client certificates.
type Auth interface {
	// Token checks a bearer token. id names it without revealing it; key
	// is a secret only holders of the token can derive, the same in every
	// dispatcher given the token.
	Token(token string) (id string, key []byte, ok bool)
	// Key returns the key of the token named id, while it is accepted.
	Key(id string) ([]byte, bool)
	// Cert reports whether r carries a client certificate the server
	// verified.
	Cert(r *http.Request) bool
}

// Cookies. The session cookie holds no token, only proof that its holder
// gave one: an expiry, the token's id and a nonce, signed with the
// token's key. Any dispatcher with the token checks it; removing the
// token from the file ends its sessions.
const (
	sessionCookie = "fleet_session"
	csrfCookie    = "fleet_csrf"
	sessionFor    = 12 * time.Hour
)

// who is the visitor of a request.
type who struct {
	ok   bool
	csrf string // the CSRF token its forms must carry
	// session is set when a login cookie let it in (logout is offered).
	session bool
}

// identify decides whether r may see the console, and its CSRF token.
func (c *Console) identify(w http.ResponseWriter, r *http.Request) who {
	a := c.cfg.Auth
	if a == nil {
		return who{ok: true, csrf: c.csrfCookie(w, r)}
	}
	if ck, err := r.Cookie(sessionCookie); err == nil {
		if key, nonce, ok := verifySession(a, ck.Value, time.Now()); ok {
			return who{ok: true, csrf: csrfOf(key, nonce), session: true}
		}
	}
	if a.Cert(r) {
		return who{ok: true, csrf: c.csrfCookie(w, r)}
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if _, _, ok := a.Token(tok); ok {
			// Not a browser: a client sending its token on each request
			// cannot be led into a cross-site request.
			return who{ok: true, csrf: "bearer"}
		}
	}
	return who{}
}

// csrfCookie returns the visitor's CSRF token when no login session
// gives one (an open console, client certificates): a random value in a
// cookie that a form must repeat, which another site can neither read nor
// set.
func (c *Console) csrfCookie(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 43 {
		return ck.Value
	}
	v := random(32)
	// Secure, but for an open console on plain HTTP to another host
	// (--insecure-http), where a browser would drop it.
	secure := r.TLS != nil || loopbackHost(r.Host) || r.Header.Get("X-Forwarded-Proto") == "https"
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/ui/", HttpOnly: true, Secure: secure,
		SameSite: http.SameSiteStrictMode})
	// The cookie is sent from the next request on; this one's forms carry
	// the value already.
	return v
}

func random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// newSession returns a session cookie's value for the token id with key.
func newSession(id string, key []byte, now time.Time) string {
	payload := make([]byte, 8, 8+len(id)+1+16)
	binary.BigEndian.PutUint64(payload, uint64(now.Add(sessionFor).Unix()))
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	payload = append(append(append(payload, nonce...), '.'), id...)
	return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(sign(key, payload))
}

func sign(key, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("fleet-console-session\x00"))
	m.Write(payload)
	return m.Sum(nil)
}

// verifySession checks a session cookie: unexpired, signed with the key
// of a token still accepted. It returns the key and the nonce.
func verifySession(a Auth, value string, now time.Time) ([]byte, []byte, bool) {
	p, s, ok := strings.Cut(value, ".")
	if !ok {
		return nil, nil, false
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(p)
	mac, err2 := base64.RawURLEncoding.DecodeString(s)
	if err1 != nil || err2 != nil || len(payload) < 8+16+2 || payload[24] != '.' {
		return nil, nil, false
	}
	key, ok := a.Key(string(payload[25:]))
	if !ok || !hmac.Equal(mac, sign(key, payload)) {
		return nil, nil, false
	}
	if int64(binary.BigEndian.Uint64(payload)) < now.Unix() {
		return nil, nil, false
	}
	return key, payload[8:24], true
}

// csrfOf is a session's CSRF token.
func csrfOf(key, nonce []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("fleet-console-csrf\x00"))
	m.Write(nonce)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRF checks an action: same origin, and the form's token.
func checkCSRF(r *http.Request, v who) bool {
	if v.csrf == "bearer" {
		return true
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		if !sameHost(o, r.Host) {
			return false
		}
	}
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(v.csrf)) == 1
}

func sameHost(origin, host string) bool {
	_, rest, ok := strings.Cut(origin, "://")
	return ok && strings.EqualFold(rest, host)
}

// loopbackHost reports whether a request's Host names this machine: an
// open console answers only those, so that a page elsewhere cannot reach
// it through a name it rebinds to 127.0.0.1.
func loopbackHost(host string) bool {
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = host
	}
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// securityHeaders are on every answer of the console.
func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}
