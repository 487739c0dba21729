// Package embedded runs the fleet's services inside the dispatcher for a
// single-machine fleet: a real NATS server with JetStream, and a
// Redis-protocol store.
package embedded

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSConfig configures the embedded NATS server.
type NATSConfig struct {
	// URL is where the server listens, from --nats-url: its host and port.
	URL string
	// DataDir holds JetStream's files (under DataDir/jetstream).
	DataDir string
	// ConfigFile is a NATS server configuration file (accounts, users,
	// TLS, a server name, a cluster block). Listen address and JetStream
	// storage from it are overridden.
	ConfigFile string
	// MaxPayload bounds a message. Defaults to 8 MiB.
	MaxPayload int32
}

// StartNATS starts a NATS server with JetStream and waits until it is
// ready for connections.
func StartNATS(c NATSConfig) (*server.Server, error) {
	host, port, err := hostPort(c.URL, 4222)
	if err != nil {
		return nil, err
	}
	opts := &server.Options{}
	if c.ConfigFile != "" {
		if opts, err = server.ProcessConfigFile(c.ConfigFile); err != nil {
			return nil, fmt.Errorf("nats config %s: %w", c.ConfigFile, err)
		}
	}
	// A name from the configuration wins: the servers of a cluster need
	// names of their own.
	if opts.ServerName == "" {
		opts.ServerName = "fleet-embedded"
	}
	opts.Host, opts.Port = host, port
	opts.JetStream = true
	opts.StoreDir = filepath.Join(c.DataDir, "jetstream")
	opts.NoSigs = true
	if opts.MaxPayload == 0 {
		opts.MaxPayload = c.MaxPayload
		if opts.MaxPayload == 0 {
			opts.MaxPayload = 8 << 20
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats server did not start listening on %s:%d", host, port)
	}
	return s, nil
}

// hostPort reads the listen address from a URL such as nats://127.0.0.1:4222
// or redis://host:6379/0. Only the first URL of a list counts.
func hostPort(raw string, defPort int) (string, int, error) {
	raw, _, _ = strings.Cut(raw, ",")
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", 0, fmt.Errorf("listen address %q: %w", raw, err)
	}
	host, portStr, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, portStr = u.Host, strconv.Itoa(defPort)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", 0, fmt.Errorf("listen address %q: bad port", raw)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return host, port, nil
}
