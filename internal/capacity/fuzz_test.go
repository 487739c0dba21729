package capacity_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/internal/capacity"
)

// FuzzOpenHidesPassword checks that the error of a Redis URL that cannot
// be used never shows the URL's password, as it is or quoted (url.Error
// quotes the URL), whatever the password holds: for one server, a
// Sentinel setup and a Cluster, with one address or several, and with a
// second password given apart.
func FuzzOpenHidesPassword(f *testing.F) {
	for _, s := range [][3]string{{"", "s3cret", "127.0.0.1:6379"}, {"fleet", "pw%zz", "h:6379"}, {"u", "p@ss", "h:x"},
		{"default", `a"b\c`, "h:6379"}, {"u", "p w x", "[::1"}, {"", "t\x00k3n", "h"},
		{"u", "pa/ss,w", "h1:26379,h2:26379"}, {"", "pw:x@y", "[::1]:7000,h"}, {"u", "p?w#x", "h:1/m"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, user, password, host string) {
		const fixed = "rediss+sentinel+cluster://@:/0,mymaster"
		if len(password) < 4 || strings.Contains(user+host+fixed, password) {
			return
		}
		quoted := strings.Trim(strconv.Quote(password), `"`)
		shows := func(err error) bool {
			msg := err.Error()
			return strings.Contains(msg, password) || strings.Contains(msg, quoted)
		}
		for _, scheme := range []string{"redis://", "rediss://", "redis+sentinel://", "rediss+sentinel://",
			"redis+cluster://", "rediss+cluster://"} {
			for _, hosts := range []string{host, host + ",127.0.0.1:1", "127.0.0.1:1," + host} {
				url := scheme + user + ":" + password + "@" + hosts + "/0"
				if strings.Contains(scheme, "sentinel") {
					url = scheme + user + ":" + password + "@" + hosts + "/mymaster/0"
				}
				for _, cfg := range []capacity.Config{{}, {Password: "apart-" + password, SentinelPassword: password}} {
					s, err := capacity.Open(url, cfg)
					if err == nil {
						_ = s.Close()
						continue
					}
					if shows(err) {
						t.Fatalf("Open(%q): the error shows the password: %v", url, err)
					}
				}
			}
		}
		// A password alone, with no "://" to tell it apart.
		if _, err := capacity.Open(user+":"+password+"@"+host, capacity.Config{}); err == nil || shows(err) {
			t.Fatalf("Open without a scheme: %v", err)
		}
	})
}
