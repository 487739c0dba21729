package job

import (
	"fmt"
	"regexp"
	"strings"
)

// Labels follow Kubernetes' rules, so that they can go onto a Job and its
// pods unchanged: a key is an optional DNS subdomain prefix and a slash,
// then a name of at most 63 characters; a value is empty or a name.
var dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// validLabelName: `^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`, by
// bytes (every record's labels are checked on every delivery).
func validLabelName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	alnum := func(c byte) bool { return word(c) && c != '_' && c != '-' }
	if !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; c != '.' && !word(c) {
			return false
		}
	}
	return true
}

// ValidateLabel checks one label key and value.
func ValidateLabel(key, value string) error {
	name := key
	if prefix, rest, ok := strings.Cut(key, "/"); ok {
		if len(prefix) > 253 || !dnsSubdomainRE.MatchString(prefix) {
			return fmt.Errorf("key %q: prefix must be a DNS subdomain", truncate(key, 70))
		}
		name = rest
	}
	if !validLabelName(name) {
		return fmt.Errorf("key %q: name must be 1 to 63 characters of [A-Za-z0-9_.-], starting and ending with a letter or digit", truncate(key, 70))
	}
	if value != "" && !validLabelName(value) {
		return fmt.Errorf("value of %q: %q must be at most 63 characters of [A-Za-z0-9_.-], starting and ending with a letter or digit", truncate(key, 70), truncate(value, 70))
	}
	return nil
}

// DNSLabel turns s into a DNS label (RFC 1123) of at most max characters, as
// Kubernetes object names and container names need: lower case letters,
// digits and dashes, starting and ending with a letter or digit. It never
// returns an empty string.
func DNSLabel(s string, max int) string {
	if max <= 0 || max > 63 {
		max = 63
	}
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(s) {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') {
			b.WriteRune(c)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	out := strings.Trim(b.String(), "-")
	if len(out) > max {
		out = strings.TrimRight(out[:max], "-")
	}
	if out == "" {
		out = "x"
	}
	return out
}
