package workspace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

func TestCreateWritesReadOnlyInputs(t *testing.T) {
	d, err := Create(t.TempDir(), "j1", 2, map[string]string{"a.txt": "A", "dir/b.txt": "B"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Remove()
	if !strings.Contains(filepath.Base(d.Root), "j1-2-") {
		t.Errorf("root %s does not name the job and attempt", d.Root)
	}
	got, err := os.ReadFile(filepath.Join(d.Inputs, "dir", "b.txt"))
	if err != nil || string(got) != "B" {
		t.Fatalf("input: %q %v", got, err)
	}
	for _, p := range []string{filepath.Join(d.Inputs, "a.txt"), filepath.Join(d.Inputs, "dir")} {
		fi, _ := os.Stat(p)
		if fi.Mode().Perm()&0o222 != 0 {
			t.Errorf("%s is writable: %s", p, fi.Mode())
		}
	}
	if os.Getuid() != 0 { // root writes anywhere
		if err := os.WriteFile(filepath.Join(d.Inputs, "new"), nil, 0o644); err == nil {
			t.Error("could write into inputs")
		}
	}
	if _, err := Create(t.TempDir(), "j1", 1, map[string]string{"../escape": "x"}); err == nil {
		t.Error("an input outside the folder was written")
	}
	if err := d.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Root); !os.IsNotExist(err) {
		t.Errorf("root left after Remove: %v", err)
	}
}

func TestCollectReadsDeclaredOutputsWithinLimits(t *testing.T) {
	d, err := Create(t.TempDir(), "j", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Remove()
	write := func(name, content string) {
		p := filepath.Join(d.Outputs, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.txt", "alpha")
	write("sub/b.txt", "beta")
	write("bin", "\xff\xfe")
	write("big", strings.Repeat("x", 100))
	os.Symlink("/etc/passwd", filepath.Join(d.Outputs, "link"))

	out, f := d.Collect([]string{"a.txt", "sub/b.txt"}, Limits{})
	if f != nil || out["a.txt"] != "alpha" || out["sub/b.txt"] != "beta" {
		t.Fatalf("collect: %v %v", out, f)
	}
	for _, tc := range []struct {
		names []string
		limit int64
		code  string
	}{
		{[]string{"a.txt", "missing.txt"}, 0, job.CodeOutputMissing},
		{[]string{"big"}, 50, job.CodeOutputLarge},
		{[]string{"a.txt", "big"}, 102, job.CodeOutputLarge},
		{[]string{"bin"}, 0, "output_not_text"},
		{[]string{"link"}, 0, job.CodeOutputMissing}, // a symlink is not a regular file
	} {
		out, f := d.Collect(tc.names, Limits{MaxOutputBytes: tc.limit})
		if f == nil || f.Code != tc.code {
			t.Errorf("collect %v (limit %d): %v, want code %s", tc.names, tc.limit, f, tc.code)
		}
		if strings.Contains(out["link"], "root") {
			t.Error("a symlink to a host file was read")
		}
	}
}
