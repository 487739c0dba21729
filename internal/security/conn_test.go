package security_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/fleet-dev/fleet/internal/cli"
	"github.com/fleet-dev/fleet/internal/embedded"
	"github.com/fleet-dev/fleet/internal/queue"
)

// writeConf writes a server configuration for one test and returns its path.
func writeConf(t testing.TB, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tryConnect connects with cc through queue.Connect and returns the error
// and everything queue.Connect logged.
func tryConnect(t testing.TB, cc queue.ConnConfig) (error, []string) {
	t.Helper()
	log, _, lines := newCapture()
	cc.Logger = log
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := queue.Connect(ctx, cc)
	if err == nil {
		nc.Close()
	}
	return err, lines()
}

// natsConfig runs the NATS flags of every command on args, as the
// commands parse them (flags, then FLEET_* variables), and returns the
// connection configuration they make.
func natsConfig(t testing.TB, args ...string) queue.ConnConfig {
	t.Helper()
	var n cli.NATSFlags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	n.Register(fs)
	if err := cli.Parse(fs, args); err != nil {
		t.Fatal(err)
	}
	cc, err := n.Config("test", nil)
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

func secretFile(t testing.TB, secret string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTLSWithClientCertificates runs the shipped fleet-tls.conf with
// certificates made here: only a client that trusts the server's CA and
// presents a certificate of the client CA, and then its role's key, gets in.
func TestTLSWithClientCertificates(t *testing.T) {
	serverCA, clientCA, otherCA := newCA(t, "server"), newCA(t, "clients"), newCA(t, "other")
	cert, key := serverCA.issue(t, "nats", true)
	t.Setenv("FLEET_NATS_SERVER_CERT", cert)
	t.Setenv("FLEET_NATS_SERVER_KEY", key)
	t.Setenv("FLEET_NATS_SERVER_CA", clientCA.file)
	k := makeKeys(t, shippedRoles...)
	s := startServer(t, shipped(t, "fleet-tls.conf"))
	url := s.url()

	clientCert, clientKey := clientCA.issue(t, "worker-1", false)
	strangerCert, strangerKey := otherCA.issue(t, "stranger", false)

	t.Run("a client with the CA, its certificate and its key gets in", func(t *testing.T) {
		c := connect(t, queue.ConnConfig{URL: url, Name: "dispatcher", NKeyFile: k[roleDispatcher],
			TLSCA: serverCA.file, TLSCert: clientCert, TLSKey: clientKey, InboxPrefix: inboxPrefix(roleDispatcher)})
		st, err := c.TLSConnectionState()
		if err != nil || !st.HandshakeComplete || len(st.PeerCertificates) == 0 ||
			st.PeerCertificates[0].Subject.CommonName != "nats" {
			t.Fatalf("TLS state: %+v, %v", st, err)
		}
		// JetStream works over it, with the role's permissions.
		js, err := jetstream.New(c.Conn)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := queue.Setup(ctx, js, queue.Config{}, nil); err != nil {
			t.Fatalf("setup over TLS: %v", err)
		}
	})

	for _, tc := range []struct {
		name string
		cc   queue.ConnConfig
		want string
	}{
		// nats.go switches to TLS when the server requires it, and then
		// knows only the system's CAs.
		{"a client without TLS options is refused", queue.ConnConfig{NKeyFile: k[roleProducer]}, "certificate"},
		{"a server certificate from an unknown CA is refused",
			queue.ConnConfig{NKeyFile: k[roleProducer], TLSCert: clientCert, TLSKey: clientKey}, "certificate"},
		{"a client without a certificate is refused",
			queue.ConnConfig{NKeyFile: k[roleProducer], TLSCA: serverCA.file}, ""},
		{"a client certificate from another CA is refused",
			queue.ConnConfig{NKeyFile: k[roleProducer], TLSCA: serverCA.file, TLSCert: strangerCert, TLSKey: strangerKey}, ""},
		{"a certificate without a key of a role is refused",
			queue.ConnConfig{TLSCA: serverCA.file, TLSCert: clientCert, TLSKey: clientKey}, "Authorization Violation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cc.URL = url
			tc.cc.ConnectTimeout = 10 * time.Second
			start := time.Now()
			err, _ := tryConnect(t, tc.cc)
			if err == nil {
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			// Such errors do not go away by waiting: no retries until the
			// timeout.
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refused after %s: queue.Connect kept retrying", d)
			}
		})
	}
}

// TestTLSServerOnly: a server that does not ask for client certificates;
// the client needs only the CA (--nats-ca).
func TestTLSServerOnly(t *testing.T) {
	ca := newCA(t, "server")
	cert, key := ca.issue(t, "nats", true)
	// The server parses a variable's value as a configuration value: one
	// with spaces would need quotes inside the variable.
	t.Setenv("FLEET_TEST_PASSWORD", "correct-horse-battery-staple")
	s := startServer(t, writeConf(t, fmt.Sprintf(`
tls { cert_file: %q, key_file: %q }
authorization { users: [ { user: fleet, password: $FLEET_TEST_PASSWORD } ] }
`, cert, key)))
	pw := secretFile(t, "correct-horse-battery-staple")
	cc := natsConfig(t, "--nats-url", s.url(), "--nats-ca", ca.file, "--nats-user", "fleet", "--nats-password-file", pw)
	c := connect(t, cc)
	if st, err := c.TLSConnectionState(); err != nil || !st.HandshakeComplete {
		t.Fatalf("not TLS: %v", err)
	}
	if err, _ := tryConnect(t, natsConfig(t, "--nats-url", s.url(), "--nats-user", "fleet", "--nats-password-file", pw)); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v", err)
	}
}

// TestTokenAuth: the token comes from --nats-token-file or FLEET_NATS_TOKEN.
func TestTokenAuth(t *testing.T) {
	const token = "t0ken-d3adb33f-cafe"
	t.Setenv("FLEET_TEST_TOKEN", token)
	s := startServer(t, writeConf(t, `authorization { token: $FLEET_TEST_TOKEN }`))

	connect(t, natsConfig(t, "--nats-url", s.url(), "--nats-token-file", secretFile(t, token)))
	t.Setenv("FLEET_NATS_TOKEN", token)
	connect(t, natsConfig(t, "--nats-url", s.url()))

	t.Setenv("FLEET_NATS_TOKEN", "")
	if err, _ := tryConnect(t, natsConfig(t, "--nats-url", s.url())); err == nil {
		t.Fatal("connected without the token")
	}
	if err, _ := tryConnect(t, natsConfig(t, "--nats-url", s.url(), "--nats-token-file", secretFile(t, "wrong-token"))); err == nil {
		t.Fatal("connected with a wrong token")
	}
}

// TestUserPasswordAuth: a plain password from the server's environment and
// a bcrypt hash in the file; the client's password comes from
// --nats-password-file or FLEET_NATS_PASSWORD.
func TestUserPasswordAuth(t *testing.T) {
	const alicePW, bobPW = "alice-pa55word", "bob-pa55word"
	hash, err := bcrypt.GenerateFromPassword([]byte(bobPW), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FLEET_TEST_ALICE_PASSWORD", alicePW)
	s := startServer(t, writeConf(t, fmt.Sprintf(`
authorization { users: [
  { user: alice, password: $FLEET_TEST_ALICE_PASSWORD }
  { user: bob, password: %q }
] }`, hash)))

	connect(t, natsConfig(t, "--nats-url", s.url(), "--nats-user", "alice", "--nats-password-file", secretFile(t, alicePW)))
	t.Setenv("FLEET_NATS_PASSWORD", bobPW)
	connect(t, natsConfig(t, "--nats-url", s.url(), "--nats-user", "bob"))
	if err, _ := tryConnect(t, natsConfig(t, "--nats-url", s.url(), "--nats-user", "alice")); err == nil {
		t.Fatal("alice connected with bob's password")
	}
}

// TestNKeySeedFile: a seed file authenticates; a key the server does not
// know, or a file that holds no seed, does not; and the error shows no
// seed.
func TestNKeySeedFile(t *testing.T) {
	k := makeKeys(t, roleProducer)
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	s := startServer(t, writeConf(t, fmt.Sprintf(`authorization { users: [ { nkey: %s } ] }`, pub)))
	seed, _ := kp.Seed()
	connect(t, natsConfig(t, "--nats-url", s.url(), "--nats-nkey", secretFile(t, string(seed))))

	if err, _ := tryConnect(t, natsConfig(t, "--nats-url", s.url(), "--nats-nkey", k[roleProducer])); err == nil ||
		!strings.Contains(err.Error(), "Authorization Violation") {
		t.Fatalf("an unknown key: %v", err)
	}
	bad := secretFile(t, "not a seed: "+string(seed[:20]))
	err, _ := tryConnect(t, natsConfig(t, "--nats-url", s.url(), "--nats-nkey", bad))
	if err == nil || strings.Contains(err.Error(), string(seed[:20])) {
		t.Fatalf("a file without a seed: %v", err)
	}
}

// TestCredsFile: a credentials file (user JWT and seed) against a server in
// operator mode, all made here with nats-io/jwt and nkeys.
func TestCredsFile(t *testing.T) {
	op, _ := nkeys.CreateOperator()
	opPub, _ := op.PublicKey()
	opJWT, err := jwt.NewOperatorClaims(opPub).Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	sys, _ := nkeys.CreateAccount()
	sysPub, _ := sys.PublicKey()
	sysJWT, err := jwt.NewAccountClaims(sysPub).Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	acc, _ := nkeys.CreateAccount()
	accPub, _ := acc.PublicKey()
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "FLEET"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	accJWT, err := ac.Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	userSeed, _ := user.Seed()
	uc := jwt.NewUserClaims(userPub)
	uc.Name = "producer"
	uc.Pub.Allow.Add("fleet.submit")
	uc.Sub.Allow.Add("_INBOX.>")
	userJWT, err := uc.Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(userJWT, userSeed)
	if err != nil {
		t.Fatal(err)
	}
	credsFile := secretFile(t, string(creds))

	s := startServer(t, writeConf(t, fmt.Sprintf(`
operator: %s
system_account: %s
resolver: MEMORY
resolver_preload: { %s: %s, %s: %s }
`, opJWT, sysPub, sysPub, sysJWT, accPub, accJWT)))

	c := connect(t, natsConfig(t, "--nats-url", s.url(), "--nats-creds", credsFile))
	// The permissions in the JWT hold.
	if err := c.Publish("fleet.jobs.default", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	c.errs.wait(t, "Permissions Violation", "fleet.jobs.default")

	// A user signed by another account's key is refused.
	other, _ := nkeys.CreateAccount()
	forged, _ := jwt.NewUserClaims(userPub).Encode(other)
	forgedCreds, _ := jwt.FormatUserConfig(forged, userSeed)
	if err, _ := tryConnect(t, natsConfig(t, "--nats-url", s.url(), "--nats-creds", secretFile(t, string(forgedCreds)))); err == nil {
		t.Fatal("a user of an unknown account connected")
	}
}

// TestConnectErrorsHideSecrets: whatever goes wrong, neither queue.Connect's
// error nor its log shows a password or a token.
func TestConnectErrorsHideSecrets(t *testing.T) {
	const pw, token = "pa55-Wr0ng-s3cret", "t0ken-Wr0ng-s3cret"
	t.Setenv("FLEET_TEST_PASSWORD", "the-right-one")
	s := startServer(t, writeConf(t, `authorization { users: [ { user: fleet, password: $FLEET_TEST_PASSWORD } ] }`))
	ts := startServer(t, writeConf(t, `authorization { token: "the-right-token" }`))
	host := strings.TrimPrefix(s.url(), "nats://")
	closed := "127.0.0.1:1"

	for _, tc := range []struct {
		name   string
		cc     queue.ConnConfig
		secret string
	}{
		{"wrong password", queue.ConnConfig{URL: s.url(), User: "fleet", Password: pw}, pw},
		{"wrong token", queue.ConnConfig{URL: ts.url(), Token: token}, token},
		{"wrong password in the URL", queue.ConnConfig{URL: "nats://fleet:" + pw + "@" + host}, pw},
		{"password in the URL, server down", queue.ConnConfig{URL: "nats://fleet:" + pw + "@" + closed}, pw},
		{"token in the URL, server down", queue.ConnConfig{URL: "nats://" + token + "@" + closed}, token},
		{"password in a URL without a scheme", queue.ConnConfig{URL: "fleet:" + pw + "@" + closed}, pw},
		{"password in the second URL of a list", queue.ConnConfig{URL: "nats://" + closed + ", nats://fleet:" + pw + "@" + closed}, pw},
		{"password that is not a valid URL escape", queue.ConnConfig{URL: "nats://fleet:" + pw + "%zz@" + host}, pw},
		{"token, server down", queue.ConnConfig{URL: "nats://" + closed, Token: token}, token},
		{"password, TLS misconfigured", queue.ConnConfig{URL: s.url(), User: "fleet", Password: pw, TLSCA: "/nonexistent/ca.pem"}, pw},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cc.ConnectTimeout = 500 * time.Millisecond
			err, logged := tryConnect(t, tc.cc)
			if err == nil {
				t.Fatal("connected")
			}
			if strings.Contains(err.Error(), tc.secret) {
				t.Errorf("the error shows the secret: %v", err)
			}
			for _, l := range logged {
				if strings.Contains(l, tc.secret) {
					t.Errorf("the log shows the secret: %s", l)
				}
			}
		})
	}
}

// TestNoCredentialsNoEntry: the shipped configuration lets no one in
// without a key it lists.
func TestNoCredentialsNoEntry(t *testing.T) {
	makeKeys(t, shippedRoles...)
	s := startServer(t, shipped(t, "fleet.conf"))
	stranger := makeKeys(t, "stranger")
	for name, cc := range map[string]queue.ConnConfig{
		"no credentials":  {URL: s.url()},
		"an unknown key":  {URL: s.url(), NKeyFile: stranger["stranger"]},
		"a user/password": {URL: s.url(), User: "producer", Password: "producer"},
		"a token":         {URL: s.url(), Token: "producer"},
	} {
		t.Run(name, func(t *testing.T) {
			err, _ := tryConnect(t, cc)
			if err == nil || !strings.Contains(err.Error(), "Authorization Violation") {
				t.Fatalf("got %v, want an authorization violation", err)
			}
		})
	}
}

// TestConfigRefusesToStartWithoutKeys: a key variable that is not set
// stops the server from starting, rather than leaving a role open.
func TestConfigRefusesToStartWithoutKeys(t *testing.T) {
	makeKeys(t, roleDispatcher, roleOperator, roleProducer)
	_, err := server.ProcessConfigFile(shipped(t, "fleet.conf"))
	if err == nil || !strings.Contains(err.Error(), "FLEET_NKEY_WORKER_DEFAULT") {
		t.Fatalf("got %v, want an error naming FLEET_NKEY_WORKER_DEFAULT", err)
	}
}

// TestEmbeddedServerRunsTheShippedConfig: `dispatcher --embedded
// --nats-server-config deploy/nats/fleet.conf` runs the same
// configuration, with its listen address and store from the dispatcher's
// flags.
func TestEmbeddedServerRunsTheShippedConfig(t *testing.T) {
	k := makeKeys(t, shippedRoles...)
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	s, err := embedded.StartNATS(embedded.NATSConfig{URL: url, DataDir: t.TempDir(), ConfigFile: shipped(t, "fleet.conf")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })

	c := connectAs(t, url, k, roleDispatcher)
	js, err := jetstream.New(c.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := queue.Setup(ctx, js, queue.Config{}, nil); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err, _ := tryConnect(t, queue.ConnConfig{URL: url}); err == nil {
		t.Fatal("the embedded server let a client in without credentials")
	}
}
