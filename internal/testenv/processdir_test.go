package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// A process's directory is new and empty; those of processes that are
// gone are removed, those of live ones kept.
func TestProcessDirRemovesTheDirsOfProcessesGone(t *testing.T) {
	prefix := fmt.Sprintf("fleet-testenv-%d-", os.Getpid())
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]bool{ // dir: kept
		strconv.Itoa(dead.Process.Pid):   false,
		strconv.Itoa(os.Getppid()):       true,
		"1234567890":                     false, // an older scheme's random name
		strconv.Itoa(os.Getpid()) + "/x": false, // this pid's, from a process before
	}
	for d := range dirs {
		if err := os.MkdirAll(filepath.Join(os.TempDir(), prefix+d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		matches, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
		for _, m := range matches {
			os.RemoveAll(m)
		}
	})
	dir, err := ProcessDir(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(os.TempDir(), prefix+strconv.Itoa(os.Getpid())); dir != want {
		t.Fatalf("dir %s, want %s", dir, want)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("this process's dir: %v, %v; want it new and empty", entries, err)
	}
	for d, kept := range dirs {
		if d == strconv.Itoa(os.Getpid())+"/x" {
			continue
		}
		_, err := os.Stat(filepath.Join(os.TempDir(), prefix+d))
		if got := err == nil; got != kept {
			t.Errorf("%s%s: kept %v, want %v", prefix, d, got, kept)
		}
	}
}
