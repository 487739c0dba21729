package cli

import (
	"flag"
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
