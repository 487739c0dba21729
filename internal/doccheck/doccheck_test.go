package doccheck_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/internal/doccheck"
	"github.com/fleet-dev/fleet/internal/schedule"
	"github.com/fleet-dev/fleet/job"
)

// root is the repository's root, two folders up from this package.
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "go.mod")); err != nil {
		t.Fatalf("the repository root %s has no go.mod: %v", r, err)
	}
	return r
}

// TestLinks checks every relative link and anchor of every Markdown file
// of the repository.
func TestLinks(t *testing.T) {
	r := root(t)
	files, err := doccheck.Files(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "docs/architecture.md", "deploy/helm/fleet/README.md"} {
		if !slices.Contains(files, want) {
			t.Errorf("%s is not among the Markdown files checked: %v", want, files)
		}
	}
	problems, err := doccheck.Check(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("%d Markdown files checked", len(files))
}

// TestCheckFindsBrokenLinks holds the checker itself to failing: a page
// with a missing file, a missing anchor here and in another page, and a
// link out of the repository gets one problem for each, and the links that
// are good get none.
func TestCheckFindsBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module x\n")
	write("docs/other.md", "# Other page\n\n## Long jobs: adoption, data directories\n\n## `fleetctl` and HTTP\n\n## Twice\n\n## Twice\n")
	write("README.md", strings.Join([]string{
		"# Top",
		"[good](docs/other.md) [good](docs/other.md#long-jobs-adoption-data-directories)",
		"[good](docs/other.md#fleetctl-and-http) [good](docs/other.md#twice-1) [good](#top) [good](docs)",
		"[site](https://example.com/x) ![image](go.mod)",
		"`[in code](nowhere.md)`",
		"```",
		"[in a block](nowhere.md)",
		"```",
		"[broken](docs/missing.md)",
		"[broken](#no-such-heading)",
		"[broken](docs/other.md#twice-2)",
		"[broken](../outside.md)",
		"[broken](/docs/other.md)",
	}, "\n")+"\n")
	problems, err := doccheck.Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md:9: docs/missing.md: no such file",
		"README.md:10: #no-such-heading: no heading of README.md has the anchor #no-such-heading",
		"README.md:11: docs/other.md#twice-2: no heading of docs/other.md has the anchor #twice-2",
		"README.md:12: ../outside.md: outside the repository",
		"README.md:13: /docs/other.md: an absolute path: GitHub resolves it against the site, not the repository",
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Contract v1, and moving to v2":                     "contract-v1-and-moving-to-v2",
		"Long jobs: adoption, data directories, live usage": "long-jobs-adoption-data-directories-live-usage",
		"`fleetctl`":                 "fleetctl",
		"A [linked](x.md) heading":   "a-linked-heading",
		"FLEET_POOL_<pool> streams":  "fleet_pool_pool-streams",
		"Redis with Sentinel — HA":   "redis-with-sentinel--ha",
		"**Bold** and __also__ bold": "bold-and-also-bold",
	} {
		if got := doccheck.Slug(h); got != want {
			t.Errorf("Slug(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestExampleRequests runs every example request of the README and of
// docs/ (a ```json block with a "command", a schedule whose template has
// one, a run whose nodes' jobs have one, or a request with a "command"
// given on a command line to echo or nats) through the dispatcher's strict
// decoder and Validate, as the schema fixtures are: an example that the
// fleet would refuse fails here.
func TestExampleRequests(t *testing.T) {
	r := root(t)
	files, err := filepath.Glob(filepath.Join(r, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(r, "README.md")}, files...)
	n := 0
	for _, f := range files {
		p, err := doccheck.Parse(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range p.Blocks {
			where := fmt.Sprintf("%s:%d", filepath.Base(f), b.Line)
			var docs []string
			switch {
			case b.Info == "json" && strings.Contains(b.Text, `"command"`):
				docs = []string{b.Text}
			case b.Info == "json" && (strings.Contains(b.Text, `"weights"`) || strings.Contains(b.Text, `"quotas"`)):
				// A change of a pool's sharing policy.
				n++
				var c job.PolicyChange
				dec := json.NewDecoder(strings.NewReader(b.Text))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&c); err != nil {
					t.Errorf("%s: the example policy change does not decode: %v", where, err)
				} else if err := c.Validate(); err != nil {
					t.Errorf("%s: the example policy change is refused: %v", where, err)
				}
			case b.Info == "sh":
				// A command block: the requests piped into fleetctl.
				for _, m := range echoed.FindAllStringSubmatch(b.Text, -1) {
					if strings.Contains(m[1], `"command"`) {
						docs = append(docs, m[1])
					}
				}
			}
			for _, doc := range docs {
				n++
				if err := checkRequest([]byte(doc)); err != nil {
					t.Errorf("%s: the example request is refused: %v\n%s", where, err, doc)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no example request found in README.md or docs/*.md")
	}
	t.Logf("%d example requests checked", n)
}

// TestExampleRequestsCanFail holds checkRequest to refusing what the
// dispatcher refuses.
func TestExampleRequestsCanFail(t *testing.T) {
	for _, doc := range []string{
		`{"command": ["true"], "no_such_field": 1}`,
		`{"command": ["true"], "priority": 9}`,
		`{"command": ["true"], "timeout": "forever"}`,
		`"outputs": {"a": "b"}, "command": ["true"]`,
	} {
		if err := checkRequest([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", doc)
		}
	}
	if err := checkRequest([]byte(`{"command": ["true"]}`)); err != nil {
		t.Errorf("the smallest request is refused: %v", err)
	}
	for _, doc := range []string{
		`{"nodes": [{"id": "a", "after": ["b"], "job": {"command": ["true"]}}]}`,
		`{"nodes": [{"id": "a", "job": {"command": ["true"], "priority": 9}}]}`,
		`{"nodes": [{"id": "a", "job": {"command": ["true"]}}], "no_such_field": 1}`,
	} {
		if err := checkRequest([]byte(doc)); err == nil {
			t.Errorf("the run %s: accepted", doc)
		}
	}
	if err := checkRequest([]byte(`{"nodes": [{"id": "a", "job": {"command": ["true"]}}]}`)); err != nil {
		t.Errorf("the smallest run is refused: %v", err)
	}
}

// echoed finds a request given on a command line: echo '{...}' | fleetctl
// submit -f -, or nats req <subject> '{...}'.
var echoed = regexp.MustCompile(`(?:echo|nats req \S+|nats pub \S+) '(\{[^']*\})'`)

func checkRequest(data []byte) error {
	if !json.Valid(data) {
		return errInvalidJSON
	}
	var probe struct {
		Template json.RawMessage `json:"template"`
		Nodes    json.RawMessage `json:"nodes"`
	}
	if json.Unmarshal(data, &probe) == nil && probe.Nodes != nil {
		// A run: checked whole, each node's job as a request.
		r, err := job.DecodeRunRequest(data, job.RunLimits{})
		if err != nil {
			return err
		}
		return r.Validate(job.Limits{}, job.RunLimits{})
	}
	if json.Unmarshal(data, &probe) == nil && probe.Template != nil {
		// A schedule: its template is a request, checked as one.
		s, err := job.DecodeSchedule(data, job.Limits{})
		if err != nil {
			return err
		}
		_, err = schedule.Validate(s, job.Limits{})
		return err
	}
	req, err := job.DecodeRequest(data, job.Limits{})
	if err != nil {
		return err
	}
	return req.Validate(job.Limits{})
}

var errInvalidJSON = errors.New("not a JSON document")
