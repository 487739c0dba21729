package cli

import (
	"flag"
	"os"
	"strings"
	"testing"
)

func TestFlagsFallBackToTheEnvironment(t *testing.T) {
	t.Setenv("FLEET_NATS_URL", "nats://from-env:4222")
	t.Setenv("FLEET_SLOTS", "7")
	t.Setenv("FLEET_POOL", "from-env")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	url := fs.String("nats-url", "nats://default:4222", "")
	slots := fs.Int("slots", 1, "")
	pool := fs.String("pool", "default", "")
	other := fs.String("other", "default", "")
	if err := Parse(fs, []string{"--pool", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if *url != "nats://from-env:4222" || *slots != 7 || *pool != "from-flag" || *other != "default" {
		t.Errorf("url %s slots %d pool %s other %s", *url, *slots, *pool, *other)
	}
	t.Setenv("FLEET_SLOTS", "many")
	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Int("slots", 1, "")
	if err := Parse(fs, nil); err == nil {
		t.Error("a bad environment value was accepted")
	}
}

func TestRedisSecretsComeFromFilesOrTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	pwFile, spwFile := dir+"/pw", dir+"/spw"
	if err := os.WriteFile(pwFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spwFile, []byte("sentinel-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) RedisFlags {
		t.Helper()
		var r RedisFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		r.Register(fs, "Redis")
		if err := Parse(fs, args); err != nil {
			t.Fatal(err)
		}
		return r
	}
	t.Setenv("FLEET_REDIS_URL", "redis+sentinel://s1,s2,s3/mymaster")
	t.Setenv("FLEET_REDIS_PASSWORD", "from-env")
	t.Setenv("FLEET_REDIS_SENTINEL_PASSWORD", "sentinel-from-env")
	r := parse()
	c, err := r.Config("pre")
	if err != nil || r.URL != "redis+sentinel://s1,s2,s3/mymaster" || c.Prefix != "pre" ||
		c.Password != "from-env" || c.SentinelPassword != "sentinel-from-env" {
		t.Errorf("from the environment: %+v %+v %v", r, c, err)
	}
	r = parse("--redis-password-file", pwFile, "--redis-sentinel-password-file", spwFile, "--redis-ca", "ca.pem")
	if c, err = r.Config(""); err != nil || c.Password != "from-file" || c.SentinelPassword != "sentinel-from-file" || c.TLS.CA != "ca.pem" {
		t.Errorf("from files: %+v %v", c, err)
	}
	r = parse("--redis-password-file", dir+"/missing")
	if _, err := r.Config(""); err == nil || !strings.Contains(err.Error(), "--redis-password-file") {
		t.Errorf("a missing password file: %v", err)
	}
	r = parse("--redis-url", "")
	if s, err := r.Open("p", nil); s != nil || err != nil {
		t.Errorf("an empty URL: %v %v", s, err)
	}
}
