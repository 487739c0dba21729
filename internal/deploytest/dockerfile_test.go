package deploytest

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// commands are the binaries of the image, one per folder of cmd/.
var commands = []string{"dispatcher", "worker", "fleetctl"}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case
	args string
}

// stage is a FROM and what follows it.
type stage struct {
	name, base string
	from       instruction
	body       []instruction
}

// parseDockerfile splits a Dockerfile into global ARGs and stages. It knows
// enough of the syntax for this repository's Dockerfile (no heredocs).
func parseDockerfile(t testing.TB, data []byte) (global []instruction, stages []stage) {
	t.Helper()
	known := []string{"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
		"ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}
	sc := bufio.NewScanner(bytes.NewReader(data))
	var cur *instruction
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue // comments may sit inside a continued instruction too
		}
		cont := strings.HasSuffix(line, "\\")
		line = strings.TrimSpace(strings.TrimSuffix(line, "\\"))
		if cur == nil {
			word, rest, _ := strings.Cut(line, " ")
			cur = &instruction{line: n, cmd: strings.ToUpper(word), args: strings.TrimSpace(rest)}
			if !slices.Contains(known, cur.cmd) {
				t.Errorf("Dockerfile:%d: unknown instruction %q", n, word)
			}
		} else {
			cur.args += " " + line
		}
		if cont {
			continue
		}
		if cur.cmd == "FROM" {
			st := stage{from: *cur}
			fields := strings.Fields(cur.args)
			fields = slices.DeleteFunc(fields, func(f string) bool { return strings.HasPrefix(f, "--") })
			switch {
			case len(fields) == 1:
				st.base = fields[0]
			case len(fields) == 3 && strings.EqualFold(fields[1], "AS"):
				st.base, st.name = fields[0], fields[2]
			default:
				t.Errorf("Dockerfile:%d: FROM %s", cur.line, cur.args)
			}
			stages = append(stages, st)
		} else if len(stages) == 0 {
			if cur.cmd != "ARG" {
				t.Errorf("Dockerfile:%d: %s before the first FROM", cur.line, cur.cmd)
			}
			global = append(global, *cur)
		} else {
			stages[len(stages)-1].body = append(stages[len(stages)-1].body, *cur)
		}
		cur = nil
	}
	if cur != nil {
		t.Errorf("Dockerfile:%d: the last instruction continues past the end", cur.line)
	}
	return global, stages
}

func (s stage) last(cmd string) string {
	v := ""
	for _, in := range s.body {
		if in.cmd == cmd {
			v = in.args
		}
	}
	return v
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.body {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

var varRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)

// TestDockerfile reads the Dockerfile the way a builder would and checks
// what no build here can: the multi-stage target needs base images from a
// registry, which this machine cannot reach (see the package comment).
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if d := strings.ToLower(strings.ReplaceAll(line, " ", "")); strings.HasPrefix(d, "#syntax=") {
			t.Errorf("Dockerfile: %q makes BuildKit fetch a frontend from a registry, even for runtime-local", line)
		}
	}
	global, stages := parseDockerfile(t, data)
	byName := map[string]stage{}
	var order []string
	for _, s := range stages {
		byName[s.name] = s
		order = append(order, s.name)
	}
	if !slices.Equal(order, []string{"runtime-local", "build", "runtime"}) {
		t.Fatalf("stages %q, want runtime-local, build and runtime (the last one is what `docker build .` makes)", order)
	}

	args := map[string]string{}
	for _, a := range global {
		k, v, _ := strings.Cut(a.args, "=")
		args[k] = v
	}
	builtin := []string{"BUILDPLATFORM", "TARGETPLATFORM", "TARGETOS", "TARGETARCH", "BUILDOS", "BUILDARCH"}
	for _, s := range stages {
		for _, m := range varRef.FindAllStringSubmatch(s.from.args, -1) {
			if _, ok := args[m[1]]; !ok && !slices.Contains(builtin, m[1]) {
				t.Errorf("Dockerfile:%d: FROM uses %s, which no ARG before the first FROM declares", s.from.line, m[1])
			}
		}
	}

	// The build image's Go is the module's.
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := ""
	for _, line := range strings.Split(string(mod), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			goVersion = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "toolchain go"); ok {
			goVersion = strings.TrimSpace(v)
			break
		}
	}
	if args["GO_VERSION"] != goVersion {
		t.Errorf("ARG GO_VERSION=%s, but go.mod asks for Go %s", args["GO_VERSION"], goVersion)
	}
	if !strings.Contains(byName["build"].base, "${GO_VERSION}") || !strings.HasPrefix(byName["build"].base, "golang:") {
		t.Errorf("the build stage starts from %s, want golang:${GO_VERSION}", byName["build"].base)
	}

	// The build compiles every command, statically.
	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, e := range entries {
		if e.IsDir() {
			cmds = append(cmds, e.Name())
		}
	}
	slices.Sort(cmds)
	if want := slices.Sorted(slices.Values(commands)); !slices.Equal(cmds, want) {
		t.Errorf("cmd/ holds %v; the image and this test know %v", cmds, want)
	}
	var goBuild string
	for _, r := range byName["build"].all("RUN") {
		if strings.Contains(r.args, "go build") {
			goBuild = r.args
		}
	}
	if !strings.Contains(goBuild, "CGO_ENABLED=0") {
		t.Errorf("the go build is not static (CGO_ENABLED=0): %s", goBuild)
	}
	for _, c := range cmds {
		if !strings.Contains(goBuild, "./cmd/"+c) {
			t.Errorf("the go build leaves out ./cmd/%s: %s", c, goBuild)
		}
		if !strings.Contains(byName["runtime-local"].last("COPY"), "bin/"+c) {
			t.Errorf("runtime-local does not copy bin/%s", c)
		}
	}
	for _, c := range byName["runtime"].all("COPY") {
		if from := regexp.MustCompile(`--from=(\S+)`).FindStringSubmatch(c.args); from != nil && from[1] != "build" {
			t.Errorf("Dockerfile:%d: COPY --from=%s, want the build stage", c.line, from[1])
		}
	}

	// Both runtime targets make the same image: a numeric non-root user, the
	// same data folder, ports and default command.
	for _, name := range []string{"runtime-local", "runtime"} {
		s := byName[name]
		if u := s.last("USER"); u != "65532:65532" {
			t.Errorf("%s: USER %q, want 65532:65532 (numeric: runtime-local has no /etc/passwd)", name, u)
		}
		if !strings.Contains(s.last("ENV"), "FLEET_DATA_DIR=/var/lib/fleet") {
			t.Errorf("%s: FLEET_DATA_DIR is not /var/lib/fleet", name)
		}
		for _, cmd := range []string{"WORKDIR", "EXPOSE", "CMD", "ENTRYPOINT"} {
			if a, b := s.last(cmd), byName["runtime-local"].last(cmd); a != b {
				t.Errorf("%s: %s %q differs from runtime-local's %q", name, cmd, a, b)
			}
		}
	}
	if byName["runtime-local"].base != "scratch" {
		t.Errorf("runtime-local starts from %s, want scratch (no registry)", byName["runtime-local"].base)
	}
}

// TestDockerignore: the build context keeps every file the build reads and
// leaves out the rest of the repository.
func TestDockerignore(t *testing.T) {
	root := repoRoot(t)
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	excluded := func(rel string) bool {
		ok, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	need := []string{"go.mod", "go.sum"}
	for _, c := range commands {
		need = append(need, "bin/"+c)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata") {
				return fs.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && rel != "." {
				return fs.SkipDir // another module: not part of the build
			}
			return nil
		}
		if (strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go")) || strings.HasPrefix(rel, "schemas"+string(filepath.Separator)) {
			need = append(need, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range need {
		if excluded(rel) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", rel)
		}
	}
	for _, rel := range []string{".git/HEAD", "bin/fleet.test", "data/jetstream", "internal/job_test.go", "deploy/helm/fleet/Chart.yaml", "hack/k8senv/up.sh"} {
		if !excluded(rel) {
			t.Errorf(".dockerignore lets %s into the build context", rel)
		}
	}
}
