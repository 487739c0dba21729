package queue

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// A job's record is read by more than the workers that run it: its
// tenant's producers, the console, whoever follows it. So the values a
// request must keep to itself, its env values and its inputs' contents,
// are sealed in the record (job.Record.Secrets) with AES-256-GCM, under a
// key of the fleet's kept in the keys bucket, which only dispatchers
// (who seal) and workers (who open) may read. The sealed text is bound to
// the job (its tenant, pool and id), so it cannot be moved to another.
// The request in the record keeps the names, with empty values.

// sealKey is the key's name in the keys bucket; a sealed text starts with
// it, so that a later key can be told apart.
const sealKey = "seal-1"

// Errors of the Sealer.
var (
	ErrNoKey    = errors.New("the keys bucket has no sealing key")
	ErrUnsealed = errors.New("the request's secrets cannot be opened")
)

// Sealer seals and opens requests' secrets.
type Sealer struct {
	aead cipher.AEAD
}

// KeysKeyValue returns the configuration of the keys bucket.
func (c Config) KeysKeyValue() jetstream.KeyValueConfig {
	c = c.WithDefaults()
	return jetstream.KeyValueConfig{
		Bucket:      c.KeysBucket(),
		Description: "The key that seals requests' env values and inputs",
		History:     1,
		Storage:     c.storage(),
		Replicas:    c.Replicas,
	}
}

// OpenSealer reads the fleet's key from the keys bucket, waiting (logging
// why) while the bucket does not exist yet or the cluster elects its
// leaders. With create, a key the bucket does not have is made: the first
// dispatcher makes it, the others read it.
func OpenSealer(ctx context.Context, js jetstream.JetStream, names Names, create bool, log *slog.Logger) (*Sealer, error) {
	kv, err := OpenBucket(ctx, js, names.KeysBucket(), log)
	if err != nil {
		return nil, err
	}
	var key []byte
	err = retry(ctx, js, log, "sealing key", func(ctx context.Context) error {
		e, err := kv.Get(ctx, sealKey)
		if err == nil {
			key = e.Value()
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return err
		}
		if !create {
			return fmt.Errorf("%w yet (a dispatcher makes it): %w", ErrNoKey, errUnsettled)
		}
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return err
		}
		if _, err := kv.Create(ctx, sealKey, k); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		return errUnsettled // read back whichever key won
	})
	if err != nil {
		return nil, fmt.Errorf("sealing key: %w", err)
	}
	return NewSealer(key)
}

// NewSealer returns a Sealer with a 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("sealing key: %d bytes, want 32", len(key))
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(b)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

type secrets struct {
	Env    map[string]string `json:"env,omitempty"`
	Inputs map[string]string `json:"inputs,omitempty"`
}

func bound(k JobKey) []byte { return []byte(k.Tenant + "/" + k.Pool + "/" + k.ID) }

// Seal moves r's env values and inputs' contents into a sealed text bound
// to job k, leaving their names in r with empty values. A request with
// neither is left as it is, and the text is empty.
func (s *Sealer) Seal(k JobKey, r *job.Request) (string, error) {
	if len(r.Env) == 0 && len(r.Inputs) == 0 {
		return "", nil
	}
	plain, err := json.Marshal(secrets{Env: r.Env, Inputs: r.Inputs})
	if err != nil {
		return "", err
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	sealed := s.aead.Seal(nonce, nonce, plain, bound(k))
	r.Env, r.Inputs = blank(r.Env), blank(r.Inputs)
	return sealKey + ":" + base64.RawStdEncoding.EncodeToString(sealed), nil
}

// Open puts back into r the values that Seal took out of it.
func (s *Sealer) Open(k JobKey, r *job.Request, text string) error {
	if text == "" {
		return nil
	}
	name, b64, ok := strings.Cut(text, ":")
	if !ok || name != sealKey {
		return fmt.Errorf("%w: sealed with a key this fleet does not have (%q)", ErrUnsealed, name)
	}
	data, err := base64.RawStdEncoding.DecodeString(b64)
	if err != nil || len(data) < s.aead.NonceSize() {
		return fmt.Errorf("%w: not a sealed text", ErrUnsealed)
	}
	plain, err := s.aead.Open(nil, data[:s.aead.NonceSize()], data[s.aead.NonceSize():], bound(k))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnsealed, err)
	}
	var sec secrets
	if err := json.Unmarshal(plain, &sec); err != nil {
		return fmt.Errorf("%w: %v", ErrUnsealed, err)
	}
	r.Env, r.Inputs = sec.Env, sec.Inputs
	return nil
}

func blank(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k := range maps.Keys(m) {
		out[k] = ""
	}
	return out
}
