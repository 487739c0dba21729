package capacity

import (
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestOpenReadsEveryForm(t *testing.T) {
	for _, tc := range []struct {
		url  string
		cfg  Config
		want string // what the client is and holds
	}{
		{"redis://127.0.0.1:6379/2", Config{}, "one 127.0.0.1:6379 db 2 pw= tls=false"},
		{"rediss://:pw@h:6380/0", Config{}, "one h:6380 db 0 pw=pw tls=true name=h"},
		{"redis://h:6379/0", Config{Password: "apart"}, "one h:6379 db 0 pw=apart tls=false"},
		{"redis+sentinel://s1,s2:26380,[::1]/mymaster", Config{Password: "apart"}, "sentinel [s1:26379 s2:26380 [::1]:26379] master mymaster db 0 pw=apart tls=false"},
		{"rediss+sentinel://u:p%40ss@s1:1/m/3", Config{SentinelPassword: "sp"}, "sentinel [s1:1] master m db 3 pw=p@ss tls=true"},
		{"redis+cluster://:pw@n1:7000,n2,[::1]:7002", Config{}, "cluster [n1:7000 n2:6379 [::1]:7002] pw=pw tls=false"},
		{"rediss+cluster://n1:7000/0", Config{Password: "apart"}, "cluster [n1:7000] pw=apart tls=true"},
	} {
		u, err := parseForTest(tc.url, tc.cfg)
		if err != nil || u != tc.want {
			t.Errorf("%s:\n got %s (%v)\nwant %s", tc.url, u, err, tc.want)
		}
	}
}

func TestOpenRefusesWhatItCannotUse(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"127.0.0.1:6379", "not a URL"},
		{"http://h", `scheme "http"`},
		{"redis+ring://h", `scheme "redis+ring"`},
		{"redis+sentinel://s1:26379", "names its master"},
		{"redis+sentinel://s1:26379/m/x", "database after the master's name"},
		{"redis+sentinel://s1:26379,/m", "address 2 has no valid host"},
		{"redis+sentinel://s1:0/m", "address 1 has no valid port"},
		{"redis+cluster://n1:7000/1", "only database 0"},
		{"redis+cluster://n1:7000?dial_timeout=1", "no query"},
		{"redis+cluster://", "no address"},
		{"redis+cluster://:pw@n1", "give it once"},
	} {
		cfg := Config{}
		if strings.Contains(tc.url, "pw@") {
			cfg.Password = "other"
		}
		_, err := Open(tc.url, cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.url, err, tc.want)
		}
	}
}

// parseForTest opens url and describes the client it made.
func parseForTest(url string, cfg Config) (string, error) {
	s, err := Open(url, cfg)
	if err != nil {
		return "", err
	}
	defer s.Close()
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		o := c.Options()
		return fmt.Sprintf("cluster %v pw=%s tls=%v", o.Addrs, o.Password, o.TLSConfig != nil), nil
	case *redis.Client:
		o := c.Options()
		if o.Addr == "FailoverClient" {
			m, err := parseMulti(url, sentinelPort)
			if err != nil {
				return "", err
			}
			master, _, _ := strings.Cut(strings.Trim(m.path, "/"), "/")
			return fmt.Sprintf("sentinel %v master %s db %d pw=%s tls=%v", m.addrs, master, o.DB, o.Password, o.TLSConfig != nil), nil
		}
		desc := fmt.Sprintf("one %s db %d pw=%s tls=%v", o.Addr, o.DB, o.Password, o.TLSConfig != nil)
		if o.TLSConfig != nil {
			desc += " name=" + o.TLSConfig.ServerName
		}
		return desc, nil
	}
	return "", fmt.Errorf("a %T", s.rdb)
}
