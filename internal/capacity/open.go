package capacity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config configures the connection beyond its URL.
type Config struct {
	// Prefix starts every key. Defaults to "fleet".
	Prefix string
	// TLS holds the files of a TLS connection (rediss schemes only).
	TLS TLS
	// Password authenticates to the Redis servers when the URL carries
	// none. Giving both is an error.
	Password string
	// SentinelPassword authenticates to the Sentinels, when they require
	// one (their requirepass); the URL's password is the servers'.
	SentinelPassword string
	// ProbeFirst and ProbeMax pace the probes of the Store's Breaker while
	// Redis is away. Default to DefaultProbeFirst and DefaultProbeMax.
	ProbeFirst, ProbeMax time.Duration
	// Logger receives the Breaker's debug lines. Defaults to slog.Default().
	Logger *slog.Logger
}

// TLS names the files of a TLS connection to Redis: a CA bundle to trust
// (the system's when empty) and a client certificate and key.
type TLS struct {
	CA, Cert, Key string
}

// Default ports of the addresses of a multi-host URL.
const (
	sentinelPort = "26379"
	serverPort   = "6379"
)

// Open connects to Redis at url, one of:
//
//	redis://[user:password@]host[:port][/db]        one server (rediss:// for TLS)
//	redis+sentinel://[user:password@]sentinel[:port][,sentinel[:port]...]/master[/db]
//	                                                the master that the Sentinels name
//	                                                (rediss+sentinel:// for TLS)
//	redis+cluster://[user:password@]node[:port][,node[:port]...]
//	                                                a Redis Cluster, found from these seed
//	                                                nodes (rediss+cluster:// for TLS)
//
// The user and password are those of the Redis servers; a Sentinel's own
// password is cfg.SentinelPassword. Ports default to 6379, and to 26379 for
// Sentinels. With TLS, the servers' certificates are checked against the
// name or address each is dialled at, for Sentinels, masters, replicas and
// Cluster nodes alike. Open does not wait for Redis to answer: callers work
// on while it is away, and once a call has found it away, the Store's
// Breaker fails the next ones at once until a probe gets an answer. Its
// errors never show the URL's password.
func Open(url string, cfg Config) (*Store, error) {
	rdb, probe, err := newClient(url, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "fleet"
	}
	s := &Store{rdb: rdb, prefix: cfg.Prefix}
	s.breaker = newBreaker(probe, cfg.ProbeFirst, cfg.ProbeMax, cfg.Logger)
	rdb.AddHook(breakerHook{s.breaker})
	s.gauge = s.breaker.observeUp()
	return s, nil
}

// How a Breaker asks whether Redis answers again. A probe dials on a
// client of its own, closed after it: the client's pool counts failed
// dials, and once it has counted as many as it holds connections it stops
// dialling and tries again only every second, which would delay noticing
// that Redis is back. A Cluster is probed through its nodes' clients:
// CLUSTER INFO on every master, which must say that the cluster is ok (a
// Cluster that lost a master without a replica refuses commands).

// pingProbe pings on a client that newProbeClient makes.
func pingProbe[C interface {
	Ping(context.Context) *redis.StatusCmd
	Close() error
}](newProbeClient func() C) func(context.Context) error {
	return func(ctx context.Context) error {
		c := newProbeClient()
		defer c.Close()
		return c.Ping(ctx).Err()
	}
}

func clusterProbe(c *redis.ClusterClient) func(context.Context) error {
	return func(ctx context.Context) error {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			info, err := n.ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster node %s: %w", n.Options().Addr, err)
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("cluster node %s: the cluster is not ok", n.Options().Addr)
			}
			return nil
		})
	}
}

// Timeouts of every Redis call, and the bound of a call whose context has
// no earlier deadline (the client heeds contexts' deadlines): a worker goes
// on by local accounting rather than wait for Redis. A dial is tried once:
// the Breaker, not the client, tries again, in the background.
const (
	dialTimeout = 2 * time.Second
	ioTimeout   = 2 * time.Second
	dialTries   = 1
	// A command is tried again (once; on a Cluster, up to three times,
	// following redirects) this long after a failure, randomized: a
	// stale pooled connection or a Cluster moving a slot, not an outage,
	// which the Breaker deals with.
	minRetryBackoff = 2 * time.Millisecond
	maxRetryBackoff = 16 * time.Millisecond
)

// newClient returns the client of rawURL and the probe of its Breaker.
func newClient(rawURL string, cfg Config) (redis.UniversalClient, func(context.Context) error, error) {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, nil, errors.New("redis url: not a URL: use redis://, rediss://, redis+sentinel:// or redis+cluster://")
	}
	base, kind, _ := strings.Cut(strings.ToLower(scheme), "+")
	if base != "redis" && base != "rediss" {
		return nil, nil, fmt.Errorf("redis url: scheme %q: use redis://, rediss://, redis+sentinel:// or redis+cluster:// "+
			"(or their rediss forms)", redactScheme(scheme))
	}
	useTLS := base == "rediss"
	var tc *tls.Config
	if useTLS {
		tc = &tls.Config{MinVersion: tls.VersionTLS12} // the name checked is the one dialled
		if err := cfg.TLS.apply(tc); err != nil {
			return nil, nil, err
		}
	}
	switch kind {
	case "":
		opts, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, nil, fmt.Errorf("redis url: %w", redactErr(err, rawURL))
		}
		if useTLS {
			tc.ServerName = opts.TLSConfig.ServerName
			opts.TLSConfig = tc
		}
		if opts.Password, err = password(opts.Password, cfg.Password); err != nil {
			return nil, nil, err
		}
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = dialTimeout, ioTimeout, ioTimeout
		opts.MaxRetries, opts.DialerRetries, opts.ContextTimeoutEnabled = 1, dialTries, true
		opts.MinRetryBackoff, opts.MaxRetryBackoff = minRetryBackoff, maxRetryBackoff
		po := *opts
		po.PoolSize, po.MaxRetries = 1, -1
		return redis.NewClient(opts), pingProbe(func() *redis.Client { return redis.NewClient(&po) }), nil
	case "sentinel":
		u, err := parseMulti(rawURL, sentinelPort)
		if err != nil {
			return nil, nil, err
		}
		master, dbText, _ := strings.Cut(strings.Trim(u.path, "/"), "/")
		if master == "" {
			return nil, nil, errors.New("redis url: a Sentinel URL names its master after the addresses: redis+sentinel://host:26379,host2:26379/mymaster[/db]")
		}
		db := 0
		if dbText != "" {
			if db, err = strconv.Atoi(dbText); err != nil || db < 0 {
				return nil, nil, errors.New("redis url: the database after the master's name is not a number")
			}
		}
		pw, err := password(u.password, cfg.Password)
		if err != nil {
			return nil, nil, err
		}
		opts := redis.FailoverOptions{
			MasterName: master, SentinelAddrs: u.addrs, SentinelPassword: cfg.SentinelPassword,
			Username: u.user, Password: pw, DB: db, TLSConfig: tc,
			DialTimeout: dialTimeout, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout, MaxRetries: 1, DialerRetries: dialTries,
			MinRetryBackoff: minRetryBackoff, MaxRetryBackoff: maxRetryBackoff, ContextTimeoutEnabled: true,
		}
		po := opts
		po.PoolSize, po.MaxRetries = 1, -1
		return redis.NewFailoverClient(&opts), pingProbe(func() *redis.Client { return redis.NewFailoverClient(&po) }), nil
	case "cluster":
		u, err := parseMulti(rawURL, serverPort)
		if err != nil {
			return nil, nil, err
		}
		if p := strings.Trim(u.path, "/"); p != "" && p != "0" {
			return nil, nil, errors.New("redis url: a Redis Cluster has only database 0")
		}
		pw, err := password(u.password, cfg.Password)
		if err != nil {
			return nil, nil, err
		}
		c := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: u.addrs, Username: u.user, Password: pw, TLSConfig: tc,
			DialTimeout: dialTimeout, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout, MaxRetries: 1, DialerRetries: dialTries,
			MinRetryBackoff: minRetryBackoff, MaxRetryBackoff: maxRetryBackoff, ContextTimeoutEnabled: true,
		})
		return c, clusterProbe(c), nil
	}
	return nil, nil, fmt.Errorf("redis url: scheme %q: use redis://, rediss://, redis+sentinel:// or redis+cluster:// "+
		"(or their rediss forms)", redactScheme(scheme))
}

// password picks the URL's password or the one given apart.
func password(inURL, apart string) (string, error) {
	if inURL != "" && apart != "" {
		return "", errors.New("redis url: the URL has a password and another was given apart (a file or the environment): give it once")
	}
	if apart != "" {
		return apart, nil
	}
	return inURL, nil
}

type multiURL struct {
	user, password string
	addrs          []string
	path           string
}

// parseMulti reads a URL with several addresses:
// scheme://[user:password@]host[:port][,host[:port]...][/path]. Its errors
// name the address by its place, never by what it holds, since a password
// with a '/' or ',' that was not escaped would spill into it.
func parseMulti(rawURL, defaultPort string) (*multiURL, error) {
	_, rest, _ := strings.Cut(rawURL, "://")
	if strings.ContainsAny(rest, "?#") {
		return nil, errors.New("redis url: a Sentinel or Cluster URL takes no query or fragment")
	}
	authority, path, _ := strings.Cut(rest, "/")
	u := &multiURL{path: path}
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		info := authority[:at]
		authority = authority[at+1:]
		user, pw, _ := strings.Cut(info, ":")
		var err1, err2 error
		u.user, err1 = url.PathUnescape(user)
		u.password, err2 = url.PathUnescape(pw)
		if err1 != nil || err2 != nil {
			return nil, errors.New("redis url: the user name or password is not URL-escaped")
		}
	}
	if authority == "" {
		return nil, errors.New("redis url: no address")
	}
	for i, a := range strings.Split(authority, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			// No port: the default one.
			host, port = strings.TrimSuffix(strings.TrimPrefix(a, "["), "]"), defaultPort
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("redis url: address %d has no valid port", i+1)
		}
		if host == "" || strings.ContainsAny(host, "[]@/ \t") {
			return nil, fmt.Errorf("redis url: address %d has no valid host", i+1)
		}
		u.addrs = append(u.addrs, net.JoinHostPort(host, port))
	}
	return u, nil
}

// redactScheme shows a scheme unless it could be part of a password (a URL
// without "://" before its credentials).
func redactScheme(s string) string {
	if strings.ContainsAny(s, "@:") || len(s) > 20 {
		return "?"
	}
	return s
}

// redactErr keeps a password in a URL out of error messages: errors about
// a URL with credentials say only that it does not parse.
func redactErr(err error, url string) error {
	if !strings.Contains(url, "@") {
		return err
	}
	return errors.New("the URL does not parse (its user name and password must be URL-escaped)")
}

func (t TLS) apply(c *tls.Config) error {
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return fmt.Errorf("redis CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("redis CA: no certificate in %s", t.CA)
		}
		c.RootCAs = pool
	}
	if t.Cert != "" || t.Key != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return fmt.Errorf("redis client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return nil
}
