package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/internal/worker"
)

// fleetctl runs a command line in the test process, as main would, and
// returns its exit code, standard output and standard error.
func fleetctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// file writes a file in the test's folder and returns its path.
func file(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGlobalFlagsBeforeOrAfterTheCommand: the global flags go before the
// command, as the nats CLI, kubectl, docker and git take them (and as
// deploy/nats/README.md shows them), or after it, or both.
func TestGlobalFlagsBeforeOrAfterTheCommand(t *testing.T) {
	f := fleettest.Start(t)
	url := f.NATS.URL()
	req := file(t, "job.json", `{"id": "global-1", "command": ["true"]}`)

	code, out, errOut := fleetctl(t, "--tenant", "acme", "--nats-url", url, "submit", "-f", req)
	if code != exitOK || out != "global-1\n" {
		t.Fatalf("global flags before submit: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	acme, err := client.New(f.NATS.Connect(t), client.WithTenant("acme"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := acme.Status(ctx, "global-1"); err != nil {
		t.Fatalf("the job is not acme's: %v", err)
	}
	if _, err := f.Client.Status(ctx, "global-1"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the job is the default tenant's too: %v", err)
	}

	for _, args := range [][]string{
		{"--nats-url=" + url, "--tenant", "acme", "-o", "json", "status", "global-1"},
		{"status", "global-1", "--nats-url", url, "--tenant=acme", "-o", "json"},
		{"--nats-url", url, "status", "--tenant", "acme", "global-1", "-o=json"},
	} {
		code, out, errOut := fleetctl(t, args...)
		if code != exitOK || !strings.Contains(out, `"id": "global-1"`) || !strings.Contains(out, `"tenant": "acme"`) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-f", req, "submit"}, exitUsage, "-f before the command is not a global flag"},
		{[]string{"--tenant"}, exitUsage, "flag needs an argument: --tenant"},
		{[]string{"--tenant", "acme"}, exitUsage, "no command given"},
		{[]string{"--tenant", "acme", "nosuch"}, exitUsage, `unknown command "nosuch"`},
		{[]string{"--tenant", "acme", "-h"}, exitOK, "Global flags, before or after the command:"},
		{[]string{"--tenant", "acme", "--help", "status"}, exitOK, "usage: fleetctl [global flags] status"},
		{[]string{"help", "status"}, exitOK, "usage: fleetctl [global flags] status"},
	} {
		code, _, errOut := fleetctl(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
}

// TestEveryCommandHasAnExample walks the command tree: each command's
// --help shows examples of it, and of each of its verbs, that read as
// fleetctl reads a command line.
func TestEveryCommandHasAnExample(t *testing.T) {
	code, _, top := fleetctl(t, "--help")
	if code != exitOK {
		t.Fatalf("fleetctl --help: exit %d", code)
	}
	for _, c := range commands {
		if !strings.Contains(top, "\n  "+c.name+" ") {
			t.Errorf("fleetctl --help does not list %s", c.name)
		}
		code, _, help := fleetctl(t, c.name, "--help")
		if code != exitOK {
			t.Errorf("fleetctl %s --help: exit %d", c.name, code)
			continue
		}
		shown := map[string]bool{}
		_, examples, _ := strings.Cut(help, "\nExamples:\n")
		examples, _, _ = strings.Cut(examples, "\n\n")
		for _, line := range strings.Split(examples, "\n") {
			_, cmdLine, ok := strings.Cut(line, "fleetctl ")
			if !ok {
				continue
			}
			cmdLine, _, _ = strings.Cut(cmdLine, "  #")
			_, name, rest, _, err := splitCommand(strings.Fields(cmdLine))
			if err != nil || name != c.name {
				t.Errorf("fleetctl %s --help: the example %q is not of %s (%v)", c.name, line, c.name, err)
				continue
			}
			shown[""] = true
			for _, a := range rest {
				if !strings.HasPrefix(a, "-") {
					shown[a] = true
					break
				}
			}
		}
		if !shown[""] {
			t.Errorf("fleetctl %s --help shows no example:\n%s", c.name, help)
		}
		for _, v := range c.verbs {
			if !shown[v] {
				t.Errorf("fleetctl %s --help shows no example of %s %s:\n%s", c.name, c.name, v, examples)
			}
		}
	}
}

// TestDuplicateSubmitSaysOneThing: a request whose id has a job already is
// not submitted again, and fleetctl says that, and only that.
func TestDuplicateSubmitSaysOneThing(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, noop.Executor{}, worker.Config{Pool: "default", Slots: 1})
	url := f.NATS.URL()
	req := file(t, "job.json", `{"id": "dup-1", "command": ["true"]}`)

	code, out, errOut := fleetctl(t, "--nats-url", url, "submit", "-f", req, "--wait")
	if code != exitOK || !strings.Contains(out, "job dup-1 submitted") || strings.Contains(errOut, "already exists") {
		t.Fatalf("first submission: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	code, out, errOut = fleetctl(t, "--nats-url", url, "submit", "-f", req, "--wait")
	if code != exitOK || strings.Contains(out, "submitted") || !strings.Contains(out, "result: succeeded") ||
		!strings.Contains(errOut, "job dup-1 already exists (succeeded): not submitted again; following it") {
		t.Errorf("second submission, --wait: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	code, out, errOut = fleetctl(t, "--nats-url", url, "submit", "-f", req)
	if code != exitOK || out != "dup-1\n" || !strings.Contains(errOut, "job dup-1 already exists (succeeded): not submitted again\n") {
		t.Errorf("third submission: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestScheduleCreateSaysARequestGoesInTemplate: a job request given as a
// schedule (-f) is refused with a word that it goes in --template.
func TestScheduleCreateSaysARequestGoesInTemplate(t *testing.T) {
	f := fleettest.Start(t)
	url := f.NATS.URL()
	req := file(t, "request.json", `{"command": ["echo", "hi"]}`)

	code, _, errOut := fleetctl(t, "--nats-url", url, "schedule", "create", "nightly", "-f", req)
	if code != exitUsage || !strings.Contains(errOut, `unknown field "command"`) ||
		!strings.Contains(errOut, "holds a job request, not a schedule: give a request with --template "+req+" and --cron or --every") {
		t.Errorf("a request as -f: exit %d, stderr %q", code, errOut)
	}
	code, out, errOut := fleetctl(t, "--nats-url", url, "schedule", "create", "nightly", "--template", req, "--every", "1h")
	if code != exitOK || !strings.Contains(out, "nightly") {
		t.Errorf("the request as --template: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// A schedule with a mistake of its own gets no such word.
	bad := file(t, "schedule.json", `{"every": "1h", "templat": {"command": ["true"]}}`)
	code, _, errOut = fleetctl(t, "--nats-url", url, "schedule", "create", "other", "-f", bad)
	if code != exitUsage || !strings.Contains(errOut, `unknown field "templat"`) || strings.Contains(errOut, "job request") {
		t.Errorf("a bad schedule: exit %d, stderr %q", code, errOut)
	}
}

// TestSubmitToAPoolWithoutWorkersSaysHowToSeeThem: a submission the
// admission refuses because no live worker of its pool could run it says
// how to list the pool's workers.
func TestSubmitToAPoolWithoutWorkersSaysHowToSeeThem(t *testing.T) {
	rs := redistest.Start(t)
	caps, err := capacity.Open(rs.URL(), capacity.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caps.Close() })
	adm, err := monitor.NewAdmission(caps, monitor.AdmitReject, fleettest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := adm.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adm.Stop(context.Background()) })
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.Admission = adm })
	url := f.NATS.URL()

	for _, c := range []struct{ request, pool string }{
		{`{"command": ["true"]}`, "default"},
		{`{"pool": "gpu", "command": ["true"]}`, "gpu"},
	} {
		req := file(t, "job.json", c.request)
		for _, wait := range [][]string{nil, {"--wait"}} {
			args := append([]string{"--nats-url", url, "submit", "-f", req}, wait...)
			code, _, errOut := fleetctl(t, args...)
			if code != exitUsage || !strings.Contains(errOut, `pool "`+c.pool+`" has no live worker`) ||
				!strings.Contains(errOut, "fleetctl workers --pool "+c.pool) {
				t.Errorf("%s %q: exit %d, stderr %q", c.request, wait, code, errOut)
			}
		}
	}
}
