package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
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
		code  job.FailureCode
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

// memStore keeps outputs in memory: the unit under test is the choice
// between inline and stored; package artifact and the executors' tests
// store them in a real object store.
type memStore struct {
	got  map[string][]byte
	fail error
}

func (m *memStore) StoreOutput(_ context.Context, name string, r io.Reader, size int64) (*job.Artifact, error) {
	if m.fail != nil {
		return nil, m.fail
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != size {
		return nil, fmt.Errorf("%s: read %d bytes, announced %d", name, len(data), size)
	}
	if m.got == nil {
		m.got = map[string][]byte{}
	}
	m.got[name] = data
	return &job.Artifact{Bucket: "b", Key: "k/" + name, Size: size, SHA256: strings.Repeat("0", 64)}, nil
}

func TestCollectToStoresWhatDoesNotFit(t *testing.T) {
	d, err := Create(t.TempDir(), "j", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Remove()
	write := func(name string, content []byte) {
		p := filepath.Join(d.Outputs, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.txt", []byte("alpha"))
	write("bin", []byte{0xff, 0xfe, 0})
	write("big.txt", []byte(strings.Repeat("x", 100)))
	write("b.txt", []byte("beta"))
	write("empty", nil)
	os.Symlink("/etc/passwd", filepath.Join(d.Outputs, "link"))

	s := &memStore{}
	// 102 bytes inline at most: a.txt (5) fits, big.txt (100) then does
	// not, b.txt (4) still does.
	inline, stored, f := d.CollectTo(context.Background(), []string{"a.txt", "bin", "big.txt", "b.txt", "empty"}, Limits{MaxOutputBytes: 102}, s)
	if f != nil {
		t.Fatal(f)
	}
	if len(inline) != 3 || inline["a.txt"] != "alpha" || inline["b.txt"] != "beta" || inline["empty"] != "" {
		t.Errorf("inline %q", inline)
	}
	if len(stored) != 2 || stored["bin"].Size != 3 || stored["big.txt"].Size != 100 {
		t.Errorf("stored %+v", stored)
	}
	if string(s.got["bin"]) != "\xff\xfe\x00" || len(s.got["big.txt"]) != 100 {
		t.Errorf("the store got %q", s.got)
	}

	for _, tc := range []struct {
		names []string
		store *memStore
		class job.FailureClass
		code  job.FailureCode
	}{
		{[]string{"a.txt", "missing"}, &memStore{}, job.ClassExecution, job.CodeOutputMissing},
		{[]string{"link"}, &memStore{}, job.ClassExecution, job.CodeOutputMissing},
		{[]string{"bin"}, &memStore{fail: job.Failf(job.ClassExecution, job.CodeOutputLarge, "over")}, job.ClassExecution, job.CodeOutputLarge},
		{[]string{"bin"}, &memStore{fail: errors.New("nats down")}, job.ClassInfrastructure, job.CodeOutputNotStored},
	} {
		_, _, f := d.CollectTo(context.Background(), tc.names, Limits{}, tc.store)
		if f == nil || f.Class != tc.class || f.Code != tc.code {
			t.Errorf("%v: %v, want %s/%s", tc.names, f, tc.class, tc.code)
		}
	}
}

func TestCreateWithFillsInputsBeforeProtectingThem(t *testing.T) {
	base := t.TempDir()
	d, err := CreateWith(base, "j", 1, map[string]string{"a.txt": "A"}, func(dir string) error {
		return os.WriteFile(filepath.Join(dir, "ref.bin"), []byte("R"), 0o444)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Remove()
	if got, _ := os.ReadFile(filepath.Join(d.Inputs, "ref.bin")); string(got) != "R" {
		t.Errorf("filled input: %q", got)
	}
	if fi, _ := os.Stat(d.Inputs); fi.Mode().Perm()&0o222 != 0 {
		t.Errorf("inputs folder is writable: %s", fi.Mode())
	}
	boom := job.Failf(job.ClassRejected, job.CodeInputMissing, "gone")
	if _, err := CreateWith(base, "j", 2, nil, func(string) error { return boom }); err != boom {
		t.Errorf("fill error: %v", err)
	}
	entries, _ := os.ReadDir(base)
	if len(entries) != 1 {
		t.Errorf("a failed fill left its workspace: %v", entries)
	}
}
