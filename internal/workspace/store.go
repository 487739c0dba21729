package workspace

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"unicode/utf8"

	"github.com/fleet-dev/fleet/job"
)

// Store keeps the outputs that do not fit in a result: the fleet's object
// store (see package artifact). StoreOutput reads size bytes from r and
// returns the output's reference; a *job.Failure error says how the
// attempt fails (an output over a limit, a store that failed).
type Store interface {
	StoreOutput(ctx context.Context, name string, r io.Reader, size int64) (*job.Artifact, error)
}

// CollectTo reads the declared outputs as Collect does, but an output that
// does not fit in the result, being larger than what is left of
// l.MaxOutputBytes or not UTF-8 text, is streamed into s instead of
// failing the attempt, and comes back as an artifact. Small text outputs
// come back inline, as with Collect, so that results of jobs whose outputs
// are small text are the same. A missing output, or one that is not a
// regular file, fails the attempt as with Collect.
func (d *Dir) CollectTo(ctx context.Context, names []string, l Limits, s Store) (map[string]string, map[string]job.Artifact, *job.Failure) {
	if len(names) == 0 {
		return nil, nil, nil
	}
	inline := make(map[string]string, len(names))
	var stored map[string]job.Artifact
	var total int64
	var missing []string
	for _, name := range names {
		p := filepath.Join(d.Outputs, filepath.FromSlash(name))
		if !job.ValidFileName(name) || !inside(d.Outputs, p) {
			return inline, stored, job.Failf(job.ClassExecution, job.CodeOutputMissing, "output %q is not a file name", name)
		}
		// Not through a symlink, which could point anywhere on the host.
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			missing = append(missing, name)
			continue
		case errors.Is(err, syscall.ELOOP):
			return inline, stored, job.Failf(job.ClassExecution, job.CodeOutputMissing, "output %s is not a regular file", name)
		case err != nil:
			return inline, stored, job.Failf(job.ClassInfrastructure, job.CodeOutputUnreadable, "output %s: %v", name, err)
		}
		text, art, fail := d.collectOne(ctx, f, name, l.max()-total, s)
		_ = f.Close()
		switch {
		case fail != nil:
			return inline, stored, fail
		case art != nil:
			if stored == nil {
				stored = make(map[string]job.Artifact)
			}
			stored[name] = *art
		default:
			total += int64(len(text))
			inline[name] = text
		}
	}
	if len(missing) > 0 {
		return inline, stored, job.Failf(job.ClassExecution, job.CodeOutputMissing, "declared outputs not written: %v", missing)
	}
	return inline, stored, nil
}

// collectOne returns an output as text when it fits in room and is UTF-8,
// else stores it.
func (d *Dir) collectOne(ctx context.Context, f *os.File, name string, room int64, s Store) (string, *job.Artifact, *job.Failure) {
	fi, err := f.Stat()
	if err != nil {
		return "", nil, job.Failf(job.ClassInfrastructure, job.CodeOutputUnreadable, "output %s: %v", name, err)
	}
	if !fi.Mode().IsRegular() {
		return "", nil, job.Failf(job.ClassExecution, job.CodeOutputMissing, "output %s is not a regular file", name)
	}
	if fi.Size() <= room {
		data, err := io.ReadAll(io.LimitReader(f, room+1))
		if err != nil {
			return "", nil, job.Failf(job.ClassInfrastructure, job.CodeOutputUnreadable, "output %s: %v", name, err)
		}
		if int64(len(data)) <= room && utf8.Valid(data) {
			return string(data), nil, nil
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", nil, job.Failf(job.ClassInfrastructure, job.CodeOutputUnreadable, "output %s: %v", name, err)
		}
	}
	art, err := s.StoreOutput(ctx, name, f, fi.Size())
	if err != nil {
		var fail *job.Failure
		if errors.As(err, &fail) {
			return "", nil, fail
		}
		return "", nil, job.Failf(job.ClassInfrastructure, job.CodeOutputNotStored, "output %s: %v", name, err)
	}
	if art == nil {
		return "", nil, job.Failf(job.ClassInfrastructure, job.CodeOutputNotStored, "output %s: the store returned no reference", name)
	}
	return "", art, nil
}
