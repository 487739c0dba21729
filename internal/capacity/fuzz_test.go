package capacity_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/internal/capacity"
)

// FuzzOpenHidesPassword checks that the error of a Redis URL that cannot
// be used never shows the URL's password, as it is or quoted (url.Error
// quotes the URL), whatever the password holds.
func FuzzOpenHidesPassword(f *testing.F) {
	for _, s := range [][3]string{{"", "s3cret", "127.0.0.1:6379"}, {"fleet", "pw%zz", "h:6379"}, {"u", "p@ss", "h:x"},
		{"default", `a"b\c`, "h:6379"}, {"u", "p w x", "[::1"}, {"", "t\x00k3n", "h"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, user, password, host string) {
		if len(password) < 4 || strings.Contains(user+host+"rediss://@:/0", password) {
			return
		}
		quoted := strings.Trim(strconv.Quote(password), `"`)
		for _, scheme := range []string{"redis://", "rediss://"} {
			url := scheme + user + ":" + password + "@" + host + "/0"
			s, err := capacity.Open(url, capacity.Config{})
			if err == nil {
				_ = s.Close()
				continue
			}
			if msg := err.Error(); strings.Contains(msg, password) || strings.Contains(msg, quoted) {
				t.Fatalf("Open(%q): the error shows the password: %v", url, err)
			}
		}
	})
}
