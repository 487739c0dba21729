package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
)

// ConnConfig says how to reach and authenticate to NATS. Secrets come from
// files or the environment, never from the command line, and are never
// logged.
type ConnConfig struct {
	URL  string // Defaults to nats://127.0.0.1:4222.
	Name string // Connection name shown by the server.
	// CredsFile is a NATS credentials file (JWT and NKey seed).
	CredsFile string
	// NKeyFile is a file holding an NKey seed.
	NKeyFile string
	// User and Password authenticate with a user name and password.
	User, Password string
	// Token authenticates with a token.
	Token string
	// TLS: a CA bundle to trust, and a client certificate and key for mTLS.
	TLSCA, TLSCert, TLSKey string
	// InboxPrefix replaces _INBOX as the prefix of the connection's reply
	// subjects, so that a server can give each role inboxes of its own
	// (see deploy/nats). Defaults to _INBOX.
	InboxPrefix string
	// ConnectTimeout bounds the first connection. Zero, the default, keeps
	// trying until ctx ends: a dispatcher or a worker may start before NATS
	// (a first install, a whole cluster restarting). Afterwards the client
	// reconnects for ever.
	ConnectTimeout time.Duration
	// PingInterval is how often the client checks that its server still
	// answers. Defaults to 10 seconds.
	PingInterval time.Duration
	// Logger gets the connection's events, and a line each time the first
	// connection is tried again. Defaults to slog.Default, without those
	// lines.
	Logger *slog.Logger
}

// Connect dials NATS. URL may list several servers, comma-separated: the
// seeds of a cluster, of which the client picks one at random and learns
// the others from it. It keeps trying, with backoff and a log line, until
// the first connection succeeds, ctx ends or ConnectTimeout passes, so that
// processes may start in any order; a refused authentication or TLS
// handshake fails at once.
func Connect(ctx context.Context, c ConnConfig) (*nats.Conn, error) {
	if c.URL == "" {
		c.URL = nats.DefaultURL
	}
	if err := checkURLs(c.URL); err != nil {
		return nil, err
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	ping := c.PingInterval
	if ping <= 0 {
		ping = 10 * time.Second
	}
	opts := []nats.Option{
		nats.Name(c.Name),
		// A cluster loses a node now and then (an upgrade, a crash): never
		// give up reconnecting, try the next server soon...
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// ...but not all at once: every worker of a dead node reconnects at
		// the same moment, and the jitter spreads them over a second
		// instead of landing them on the survivors together.
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		// A killed server closes its sockets and the client notices at
		// once; a node cut off by the network or powered off does not. The
		// client then notices only when its pings go unanswered: the
		// default (2 minutes, 2 outstanding) would leave a worker on a dead
		// node for 4 to 6 minutes. With 10s and 3, it moves within 40s.
		nats.PingInterval(ping),
		nats.MaxPingsOutstanding(3),
		// What is published while reconnecting is kept and sent once
		// connected: acks, progress and results are not lost with a node.
		// The buffer is bounded so that a long outage ends in errors, not
		// in memory growth.
		nats.ReconnectBufSize(64 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted(), "server", nc.ConnectedServerName())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			subj := ""
			if s != nil {
				subj = s.Subject
			}
			log.Warn("NATS error", "subject", subj, "err", err)
		}),
	}
	switch {
	case c.CredsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	case c.NKeyFile != "":
		o, err := nats.NkeyOptionFromSeed(c.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("read nkey seed %s: %w", c.NKeyFile, err)
		}
		opts = append(opts, o)
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.Token != "" {
		opts = append(opts, nats.Token(c.Token))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	if c.TLSCert != "" || c.TLSKey != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	// The first connection is retried here rather than with
	// nats.RetryOnFailedConnect, which would hand back a connection that is
	// not connected yet and report a refused password only to a callback:
	// here, a misconfiguration fails Connect with its reason.
	if c.ConnectTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.ConnectTimeout)
		defer cancel()
	}
	start := time.Now()
	b := backoff.WithContext(backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(200*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(0)), ctx)
	var last error
	nc, err := backoff.RetryNotifyWithData(func() (*nats.Conn, error) {
		nc, err := nats.Connect(c.URL, opts...)
		if err == nil {
			return nc, nil
		}
		last = err
		// Authentication and TLS problems will not go away by waiting.
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
			strings.Contains(err.Error(), "tls") || strings.Contains(err.Error(), "x509") {
			return nil, backoff.Permanent(err)
		}
		return nil, err
	}, b, func(err error, next time.Duration) {
		// Only with a logger of the caller's: a command line tool gives
		// none and says itself why it could not connect.
		if c.Logger != nil {
			log.Info("waiting for NATS", "url", redact(c.URL), "err", err,
				"waited", time.Since(start).Round(time.Millisecond), "retry_in", next.Round(time.Millisecond))
		}
	})
	if err != nil {
		if last != nil && !errors.Is(err, last) {
			err = fmt.Errorf("%w (after %s: %w)", last, time.Since(start).Round(time.Millisecond), err)
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w", redact(c.URL), err)
	}
	return nc, nil
}

// redact removes credentials from a URL before it is logged: everything
// before the last @, keeping the scheme when there is a real one.
func redact(u string) string {
	at := strings.LastIndex(u, "@")
	if at < 0 {
		return u
	}
	scheme := ""
	if s, _, ok := strings.Cut(u, "://"); ok && isScheme(strings.TrimSpace(s)) {
		scheme = strings.TrimSpace(s) + "://"
	}
	return scheme + "[redacted]@" + u[at+1:]
}

func isScheme(s string) bool {
	for i, r := range s {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !letter && (i == 0 || !(r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return false
		}
	}
	return s != ""
}

// checkURLs refuses URLs that do not parse, with a message that does not
// quote them: url.Parse's errors would show a password.
func checkURLs(list string) error {
	for _, u := range strings.Split(list, ",") {
		u = strings.TrimSpace(u)
		if u != "" && !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		if _, err := url.Parse(u); err != nil {
			return fmt.Errorf("NATS URL %s does not parse (a password in it must be URL-escaped)", redact(u))
		}
	}
	return nil
}

// FileSecret reads a secret from a file, trimming a final newline, so that
// tokens and passwords can come from mounted secrets.
func FileSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read secret: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
