// Package workspace lays out the folders of one attempt, the contract every
// executor offers a job: inputs (read-only), outputs and work, and reads
// the declared outputs back after the run.
package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"unicode/utf8"

	"github.com/fleet-dev/fleet/job"
)

// Where a container sees the workspace.
const (
	ContainerInputs  = "/fleet/inputs"
	ContainerOutputs = "/fleet/outputs"
	ContainerWork    = "/fleet/work"
	// ContainerData is where a job that asked for a data directory
	// (persist) sees it in a container; FLEET_DATA names it everywhere.
	ContainerData = "/fleet/data"
)

// DefaultMaxOutputBytes bounds all outputs of one attempt together, when
// no limit is given.
const DefaultMaxOutputBytes = 512 << 10

// Limits bound the outputs read back into a result, which must fit in one
// NATS message.
type Limits struct {
	// MaxOutputBytes bounds all outputs of one attempt together.
	// Defaults to DefaultMaxOutputBytes (512 KiB).
	MaxOutputBytes int64
}

func (l Limits) max() int64 {
	if l.MaxOutputBytes <= 0 {
		return DefaultMaxOutputBytes
	}
	return l.MaxOutputBytes
}

// Dir is the workspace of one attempt.
type Dir struct {
	Root    string
	Inputs  string
	Outputs string
	Work    string
	// prune are the folders above Root removed with it once empty.
	prune []string
}

// Create makes a fresh workspace under base for an attempt of a job and
// writes the inputs into it, read-only. Outputs and work are writable by
// any user, so that a container running as another user can use them.
func Create(base, jobID string, attempt int, inputs map[string]string) (*Dir, error) {
	return CreateWith(base, jobID, attempt, inputs, nil)
}

// CreateWith is Create, and fill, when not nil, writes more inputs into the
// inputs folder (its argument) before they are made read-only: the inputs
// by reference. When fill fails, the workspace is removed and its error
// returned as it is.
func CreateWith(base, jobID string, attempt int, inputs map[string]string, fill func(inputs string) error) (*Dir, error) {
	return create(base, jobID+"-"+strconv.Itoa(attempt), nil, inputs, fill)
}

// RunsDir is the folder of the base where the attempts of runs' nodes
// are laid out, a folder a run and a folder a node in it, as the seed laid
// out a run: <base>/runs/<run>/<node>/<attempt>-<random>.
const RunsDir = "runs"

// CreateForNode is CreateWith for an attempt of a run's node, in the run's
// and the node's folders (see RunsDir); removing the workspace removes
// those folders too once they are empty.
func CreateForNode(base, run, node string, attempt int, inputs map[string]string, fill func(inputs string) error) (*Dir, error) {
	nodeDir := filepath.Join(base, RunsDir, run, node)
	return create(nodeDir, strconv.Itoa(attempt), []string{nodeDir, filepath.Dir(nodeDir)}, inputs, fill)
}

// create makes the workspace <parent>/<name>-<random>; prune are the
// folders above it to remove, once empty, after it.
func create(parent, name string, prune []string, inputs map[string]string, fill func(inputs string) error) (*Dir, error) {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	root := filepath.Join(parent, name+"-"+hex.EncodeToString(rnd[:]))
	d := &Dir{Root: root, Inputs: filepath.Join(root, "inputs"), Outputs: filepath.Join(root, "outputs"), Work: filepath.Join(root, "work"),
		prune: prune}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("create workspace: %w", err)
	}
	// Mkdir, not MkdirAll: each folder is new, and a directory operation
	// can cost more than the rest of a short attempt on a slow disk.
	for _, p := range []string{d.Root, d.Inputs, d.Outputs, d.Work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return nil, fmt.Errorf("create workspace: %w", err)
		}
	}
	for _, p := range []string{d.Outputs, d.Work} {
		if err := os.Chmod(p, 0o777); err != nil {
			return nil, fmt.Errorf("create workspace: %w", err)
		}
	}
	for name, content := range inputs {
		if !job.ValidFileName(name) {
			return nil, fmt.Errorf("input name %q is not a relative file name", name)
		}
		p := filepath.Join(d.Inputs, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, fmt.Errorf("write input %s: %w", name, err)
		}
		if err := os.WriteFile(p, []byte(content), 0o444); err != nil {
			return nil, fmt.Errorf("write input %s: %w", name, err)
		}
	}
	if fill != nil {
		if err := fill(d.Inputs); err != nil {
			_ = d.Remove()
			return nil, err
		}
	}
	// Make the inputs read-only, folders included.
	err := filepath.WalkDir(d.Inputs, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			return os.Chmod(p, 0o555)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("protect inputs: %w", err)
	}
	return d, nil
}

// Collect reads the declared outputs. It returns those found, and a
// failure when one is missing, is not a regular file, is not UTF-8 text,
// or when they are too large together.
func (d *Dir) Collect(names []string, l Limits) (map[string]string, *job.Failure) {
	if len(names) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(names))
	var total int64
	var missing []string
	for _, name := range names {
		p := filepath.Join(d.Outputs, filepath.FromSlash(name))
		if !job.ValidFileName(name) || !inside(d.Outputs, p) {
			return out, job.Failf(job.ClassExecution, job.CodeOutputMissing, "output %q is not a file name", name)
		}
		// Lstat, not Stat: a symlink could point anywhere on the host.
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, name)
			continue
		}
		if err != nil {
			return out, job.Failf(job.ClassInfrastructure, job.CodeOutputUnreadable, "output %s: %v", name, err)
		}
		if !fi.Mode().IsRegular() {
			return out, job.Failf(job.ClassExecution, job.CodeOutputMissing, "output %s is not a regular file", name)
		}
		if total+fi.Size() > l.max() {
			return out, job.Failf(job.ClassExecution, job.CodeOutputLarge,
				"outputs are over the limit of %d bytes (%s is %d bytes)", l.max(), name, fi.Size())
		}
		data, err := readAtMost(p, l.max()-total)
		if err != nil {
			return out, job.Failf(job.ClassExecution, job.CodeOutputLarge, "output %s: %v", name, err)
		}
		if !utf8.Valid(data) {
			return out, job.Failf(job.ClassExecution, job.CodeOutputNotText, "output %s is not UTF-8 text", name)
		}
		total += int64(len(data))
		out[name] = string(data)
	}
	if len(missing) > 0 {
		return out, job.Failf(job.ClassExecution, job.CodeOutputMissing, "declared outputs not written: %v", missing)
	}
	return out, nil
}

func readAtMost(p string, n int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, n+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > n {
		return nil, fmt.Errorf("over the output limit")
	}
	return data, nil
}

func inside(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !filepath.IsAbs(rel) && (len(rel) < 3 || rel[:3] != "../")
}

// Remove deletes the workspace, read-only folders included.
func (d *Dir) Remove() error {
	_ = filepath.WalkDir(d.Root, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	err := os.RemoveAll(d.Root)
	for _, p := range d.prune {
		_ = os.Remove(p) // only once empty: another attempt's may be there
	}
	return err
}
