package job

import (
	"fmt"
	"regexp"
	"strings"
)

// Labels follow Kubernetes' rules, so that they can go onto a Job and its
// pods unchanged: a key is an optional DNS subdomain prefix and a slash,
// then a name of at most 63 characters; a value is empty or a name.
var (
	labelNameRE    = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// ValidateLabel checks one label key and value.
func ValidateLabel(key, value string) error {
	name := key
	if prefix, rest, ok := strings.Cut(key, "/"); ok {
		if len(prefix) > 253 || !dnsSubdomainRE.MatchString(prefix) {
			return fmt.Errorf("key %q: prefix must be a DNS subdomain", truncate(key, 70))
		}
		name = rest
	}
	if !labelNameRE.MatchString(name) {
		return fmt.Errorf("key %q: name must be 1 to 63 characters of [A-Za-z0-9_.-], starting and ending with a letter or digit", truncate(key, 70))
	}
	if value != "" && !labelNameRE.MatchString(value) {
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
