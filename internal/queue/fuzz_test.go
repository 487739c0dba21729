package queue

import (
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

// FuzzSubjects checks that the job id read back from a subject is the id
// the subject was made for, for every valid id and prefix, and that the
// subjects made from valid ids are NATS subjects without wildcards or
// empty tokens (ids are tokens of subjects, and permissions match on
// them).
func FuzzSubjects(f *testing.F) {
	for _, s := range [][2]string{{"fleet", "j1"}, {"fleet", "a.b.c"}, {"acme.fleet", "x"}, {"fleet", "01hzy"},
		{"", "id"}, {"f", "a..b"}, {"f", ".a"}, {"f", "*"}, {"f", ">"}, {"f", "a b"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, prefix, id string) {
		if !job.ValidID(id) || !validPrefix(prefix) {
			return
		}
		n := Names{Prefix: prefix}
		for _, subj := range []string{n.Events(id), n.Results(id), n.Cancel(id)} {
			if got := n.JobID(subj); got != id {
				t.Fatalf("JobID(%q) = %q, want %q", subj, got, id)
			}
			for _, tok := range strings.Split(subj, ".") {
				if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
					t.Fatalf("subject %q has a token %q that is not a literal", subj, tok)
				}
			}
		}
		if !strings.HasPrefix(n.KVSubject(id), "$KV."+n.Bucket()+".") {
			t.Fatalf("KV subject %q", n.KVSubject(id))
		}
	})
}

// validPrefix is what a prefix must be for the subjects above to be
// literal: dot-separated tokens of the characters ids use.
func validPrefix(p string) bool {
	return p == "" || job.ValidID(p)
}

// FuzzRedact checks that the URL queue.Connect puts in its errors never
// shows the password of a URL's user information, in any of the forms
// nats.go accepts: with or without a scheme, one URL or a list.
func FuzzRedact(f *testing.F) {
	for _, s := range [][3]string{{"fleet", "s3cret", "127.0.0.1:4222"}, {"u", "p@ss:w/rd", "nats.example.com"},
		{"", "tok3n-value", "h:4222"}, {"user", "pw%zz", "h"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, user, password, host string) {
		// Only a password that cannot be confused with what may be shown
		// can be looked for.
		shown := user + "\x00nats://tls://[redacted]@" + host + ", nats://" + host + ","
		if len(password) < 4 || strings.Contains(shown, password) {
			return
		}
		userinfo := user + ":" + password + "@"
		for _, u := range []string{
			"nats://" + userinfo + host,
			"tls://" + userinfo + host,
			userinfo + host,
			"nats://" + userinfo + host + ",nats://" + userinfo + host,
			"nats://" + host + ", nats://" + userinfo + host,
			"nats://" + userinfo + host + ", nats://" + host,
		} {
			if got := redact(u); strings.Contains(got, password) {
				t.Fatalf("redact(%q) = %q shows the password", u, got)
			}
		}
	})
}
