package cli

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/queue"
)

// RedisFlags are the flags of the capacity store's connection. Passwords
// come from files or from FLEET_REDIS_PASSWORD and
// FLEET_REDIS_SENTINEL_PASSWORD, never from the command line; a password in
// --redis-url is still taken (read it from FLEET_REDIS_URL, not the
// command line).
type RedisFlags struct {
	URL, PasswordFile, SentinelPasswordFile string
	TLS                                     capacity.TLS
}

// RedisURLForms is the help of --redis-url's forms.
const RedisURLForms = "redis://[user:pw@]host:port/db (rediss:// for TLS); " +
	"redis+sentinel://[user:pw@]sentinel:26379,sentinel2:26379/<master>[/db]; " +
	"redis+cluster://[user:pw@]node:6379,node2:6379 (seed nodes); " +
	"rediss+sentinel:// and rediss+cluster:// for TLS"

// Register adds the Redis flags; what says what Redis holds for this
// command.
func (r *RedisFlags) Register(fs *flag.FlagSet, what string) {
	fs.StringVar(&r.URL, "redis-url", "redis://127.0.0.1:6379/0", what+": "+RedisURLForms+"; empty: no capacity")
	fs.StringVar(&r.PasswordFile, "redis-password-file", "",
		"file holding the Redis servers' password, when --redis-url has none (or set FLEET_REDIS_PASSWORD)")
	fs.StringVar(&r.SentinelPasswordFile, "redis-sentinel-password-file", "",
		"with redis+sentinel://: file holding the Sentinels' own password (or set FLEET_REDIS_SENTINEL_PASSWORD)")
	fs.StringVar(&r.TLS.CA, "redis-ca", "", "with rediss: CA bundle to verify the Redis servers' (and Sentinels') certificates (default: the system's)")
	fs.StringVar(&r.TLS.Cert, "redis-cert", "", "with rediss: client certificate")
	fs.StringVar(&r.TLS.Key, "redis-key", "", "with rediss: client key")
}

// Config returns the connection's configuration, reading secret files.
func (r *RedisFlags) Config(prefix string) (capacity.Config, error) {
	c := capacity.Config{Prefix: prefix, TLS: r.TLS,
		Password: os.Getenv("FLEET_REDIS_PASSWORD"), SentinelPassword: os.Getenv("FLEET_REDIS_SENTINEL_PASSWORD")}
	var err error
	if r.PasswordFile != "" {
		if c.Password, err = queue.FileSecret(r.PasswordFile); err != nil {
			return c, fmt.Errorf("--redis-password-file: %w", err)
		}
	}
	if r.SentinelPasswordFile != "" {
		if c.SentinelPassword, err = queue.FileSecret(r.SentinelPasswordFile); err != nil {
			return c, fmt.Errorf("--redis-sentinel-password-file: %w", err)
		}
	}
	return c, nil
}

// Open opens the capacity store, or returns nil when --redis-url is empty;
// log gets its breaker's lines.
func (r *RedisFlags) Open(prefix string, log *slog.Logger) (*capacity.Store, error) {
	if r.URL == "" {
		return nil, nil
	}
	c, err := r.Config(prefix)
	if err != nil {
		return nil, err
	}
	c.Logger = log
	return capacity.Open(r.URL, c)
}
