// Package cli holds what the fleet's commands share: flags that fall back to
// FLEET_* environment variables, logging, the NATS connection flags, and
// signal handling.
package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fleet-dev/fleet/internal/queue"
)

// EnvName is the environment variable of a flag: --nats-url is FLEET_NATS_URL.
func EnvName(flagName string) string {
	return "FLEET_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args, then gives every flag not set on the command line the
// value of its environment variable, if set. The command line wins over the
// environment, which wins over the default.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %w", EnvName(f.Name), e)
			}
		}
	})
	return err
}

// Usage prints a command's flags with their environment variables.
func Usage(fs *flag.FlagSet, synopsis string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n\nFlags (each also read from its FLEET_* environment variable):\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
				def = fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(w, "  --%s  [%s]\n      %s%s\n", f.Name, EnvName(f.Name), f.Usage, def)
		})
	}
}

// LogFlags are the logging flags.
type LogFlags struct {
	Format, Level string
}

// Register adds --log-format and --log-level.
func (l *LogFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&l.Format, "log-format", "text", "log format: text or json")
	fs.StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn or error")
}

// Logger builds the logger and makes it the default.
func (l *LogFlags) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch l.Format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: use text or json", l.Format)
	}
	log := slog.New(h)
	slog.SetDefault(log)
	return log, nil
}

// NATSFlags are the flags of a NATS connection. Passwords and tokens come
// from files or from FLEET_NATS_PASSWORD and FLEET_NATS_TOKEN, never from
// the command line, where other users could read them.
type NATSFlags struct {
	URL, Creds, NKey, User, PasswordFile, TokenFile, CA, Cert, Key, InboxPrefix string
}

// Register adds the NATS flags.
func (n *NATSFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&n.URL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	fs.StringVar(&n.Creds, "nats-creds", "", "NATS credentials file (JWT and NKey seed)")
	fs.StringVar(&n.NKey, "nats-nkey", "", "file holding an NKey seed")
	fs.StringVar(&n.User, "nats-user", "", "NATS user name; the password from --nats-password-file or FLEET_NATS_PASSWORD")
	fs.StringVar(&n.PasswordFile, "nats-password-file", "", "file holding the NATS password")
	fs.StringVar(&n.TokenFile, "nats-token-file", "", "file holding a NATS token (or set FLEET_NATS_TOKEN)")
	fs.StringVar(&n.CA, "nats-ca", "", "CA bundle to verify the NATS server's certificate")
	fs.StringVar(&n.Cert, "nats-cert", "", "client certificate for NATS mutual TLS")
	fs.StringVar(&n.Key, "nats-key", "", "client key for NATS mutual TLS")
	fs.StringVar(&n.InboxPrefix, "nats-inbox-prefix", "", "prefix of this process's reply subjects (default _INBOX; see deploy/nats)")
}

// Config returns the connection configuration, reading secret files.
func (n *NATSFlags) Config(name string, log *slog.Logger) (queue.ConnConfig, error) {
	c := queue.ConnConfig{URL: n.URL, Name: name, CredsFile: n.Creds, NKeyFile: n.NKey, User: n.User,
		TLSCA: n.CA, TLSCert: n.Cert, TLSKey: n.Key, InboxPrefix: n.InboxPrefix, Logger: log,
		Password: os.Getenv("FLEET_NATS_PASSWORD"), Token: os.Getenv("FLEET_NATS_TOKEN")}
	var err error
	if n.PasswordFile != "" {
		if c.Password, err = queue.FileSecret(n.PasswordFile); err != nil {
			return c, fmt.Errorf("--nats-password-file: %w", err)
		}
	}
	if n.TokenFile != "" {
		if c.Token, err = queue.FileSecret(n.TokenFile); err != nil {
			return c, fmt.Errorf("--nats-token-file: %w", err)
		}
	}
	return c, nil
}

// SignalContext returns a context cancelled at the first SIGINT or SIGTERM,
// and a channel that receives the second one.
func SignalContext() (context.Context, <-chan os.Signal, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	second := make(chan os.Signal, 1)
	go func() {
		<-sigs
		cancel()
		s := <-sigs
		second <- s
	}()
	return ctx, second, func() { signal.Stop(sigs); cancel() }
}
