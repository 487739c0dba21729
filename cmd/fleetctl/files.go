package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/job"
)

func init() {
	var name string
	var outFile string
	var attempt int
	var follow, timestamps bool
	commands = append(commands,
		&command{
			name: "upload", args: "FILE [--name N]",
			help: "Upload a file to the fleet's object store (- reads standard input, with --name).\n" +
				"Prints the reference to put in a request's input_refs: {\"key\": …, \"sha256\": …, \"size\": …}.",
			example: "fleetctl upload data.csv\n" +
				"tar c src | fleetctl upload - --name src.tar",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&name, "name", "", "the object's key (default: a new id and the file's name)")
			},
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				if len(args) != 1 {
					return exit(exitUsage, "expected one file, got %d arguments", len(args))
				}
				return upload(ctx, e, args[0], name)
			},
		},
		&command{
			name: "output", args: "ID NAME [-o FILE]", fileOutput: true,
			help: "Write a declared output of a finished job to standard output, or to FILE (-o).\n" +
				"The bytes are checked against the result's SHA-256; FILE appears only once they are.",
			example: "fleetctl output tour-1 report\n" +
				"fleetctl output tour-1 model -o model.bin",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&outFile, "o", "", "write to this file instead of standard output")
			},
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				if len(args) != 2 {
					return exit(exitUsage, "expected a job id and an output name, got %d arguments", len(args))
				}
				return output(ctx, e, args[0], args[1], outFile)
			},
		},
		&command{
			name: "logs", args: "ID [--attempt N] [--follow]",
			help: "Print a job's archived log: every line its latest attempt (or attempt N) printed, in order.\n" +
				"--follow prints a running job's lines as they are stored, through its later attempts, until it ends.\n" +
				"--timestamps prints each line with its time and stream; -o json, one object per line.",
			example: "fleetctl logs tour-1\n" +
				"fleetctl logs tour-1 --attempt 1\n" +
				"fleetctl logs tour-1 --follow --timestamps",
			flags: func(fs *flag.FlagSet) {
				fs.IntVar(&attempt, "attempt", 0, "the attempt, from 1 (default: the latest)")
				fs.BoolVar(&follow, "follow", false, "keep printing while the job runs")
				fs.BoolVar(&timestamps, "timestamps", false, "print each line's time and stream")
			},
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				id, err := oneID(args)
				if err != nil {
					return err
				}
				return logs(ctx, e, id, client.LogOptions{Attempt: attempt, Follow: follow}, timestamps)
			},
		},
	)
}

func upload(ctx context.Context, e *env, file, key string) error {
	var src io.Reader
	if file == "-" {
		if key == "" {
			return exit(exitUsage, "uploading standard input needs --name")
		}
		src = os.Stdin
	} else {
		f, err := os.Open(file)
		if err != nil {
			return exit(exitUsage, "%v", err)
		}
		defer f.Close()
		src = f
		if key == "" {
			key = job.NewID() + "/" + filepath.Base(file)
		}
	}
	if err := job.CheckObjectKey(key); err != nil {
		return exit(exitUsage, "--name: %v", err)
	}
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	ref, err := c.Upload(ctx, key, src)
	if err != nil {
		return err
	}
	data, err := json.Marshal(ref)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, string(data))
	return nil
}

// inputFiles are the --input flags of submit: NAME=@FILE.
type inputFiles []inputFile

type inputFile struct{ name, path string }

func (f *inputFiles) String() string { return "" }

func (f *inputFiles) Set(v string) error {
	name, path, ok := strings.Cut(v, "=@")
	if !ok || path == "" {
		return fmt.Errorf("%q: use NAME=@FILE", v)
	}
	if !job.ValidFileName(name) {
		return fmt.Errorf("%q: NAME must be a relative path of [A-Za-z0-9_.-] segments", name)
	}
	*f = append(*f, inputFile{name, path})
	return nil
}

// withInputs uploads the --input files and adds them to the request
// document's input_refs; the rest of the document is left as it is, for
// the dispatcher to judge.
func withInputs(ctx context.Context, c *client.Client, data []byte, inputs inputFiles) ([]byte, error) {
	if len(inputs) == 0 {
		return data, nil
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil || doc == nil {
		return nil, exit(exitUsage, "--input needs the request to be a JSON object")
	}
	refs := map[string]json.RawMessage{}
	if raw, ok := doc["input_refs"]; ok {
		if err := json.Unmarshal(raw, &refs); err != nil {
			return nil, exit(exitUsage, "input_refs: %v", err)
		}
	}
	// One folder per submission, so that uploads never replace another's.
	dir := job.NewID()
	for _, in := range inputs {
		if _, dup := refs[in.name]; dup {
			return nil, exit(exitUsage, "--input %s: the request names that input already", in.name)
		}
		if _, err := os.Stat(in.path); err != nil {
			return nil, exit(exitUsage, "--input %s: %v", in.name, err)
		}
		ref, err := c.UploadFile(ctx, in.path, dir+"/"+in.name)
		if err != nil {
			return nil, fmt.Errorf("--input %s: %w", in.name, err)
		}
		if refs[in.name], err = json.Marshal(ref); err != nil {
			return nil, err
		}
	}
	var err error
	if doc["input_refs"], err = json.Marshal(refs); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return bytes.TrimRight(out.Bytes(), "\n"), nil
}

func output(ctx context.Context, e *env, id, name, file string) error {
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	o, err := c.Output(ctx, id, name)
	if err != nil {
		return err
	}
	defer o.Close()
	if file == "" || file == "-" {
		if _, err := io.Copy(e.stdout, o); err != nil {
			return fmt.Errorf("output %s of %s: %w", name, id, err)
		}
		return nil
	}
	// Into a file beside FILE, renamed once every byte is checked.
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(file), "."+filepath.Base(file)+".part-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return exit(exitUsage, "%v", err)
	}
	_, err = io.Copy(f, o)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("output %s of %s: %w", name, id, err)
	}
	return nil
}

func logs(ctx context.Context, e *env, id string, o client.LogOptions, timestamps bool) error {
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	r, err := c.Logs(ctx, id, o)
	if err != nil {
		return err
	}
	defer r.Close()
	w := &lineWriter{out: e.stdout, json: e.json(), stamps: timestamps}
	buf := make([]byte, 256<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := w.write(buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return w.flush()
		}
		if err != nil {
			_ = w.flush()
			if ctx.Err() != nil {
				return exit(exitFleet, "interrupted")
			}
			return fmt.Errorf("logs of %s: %w", id, err)
		}
		// What came is printed at once: a follower sees lines as stored.
		if err := w.flush(); err != nil {
			return err
		}
	}
}

// lineWriter prints the lines of an archived log: the text of each, or
// with stamps the stored line, or JSON objects.
type lineWriter struct {
	out     io.Writer
	json    bool
	stamps  bool
	partial []byte
	pending bytes.Buffer
}

func (w *lineWriter) write(p []byte) error {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			return nil
		}
		line := p[:i]
		if len(w.partial) > 0 {
			line = append(w.partial, line...)
		}
		if err := w.line(line); err != nil {
			return err
		}
		w.partial = w.partial[:0]
		p = p[i+1:]
	}
	return nil
}

func (w *lineWriter) line(b []byte) error {
	if w.stamps && !w.json {
		w.pending.Write(b)
		w.pending.WriteByte('\n')
		return nil
	}
	l, err := client.ParseLogLine(string(b))
	if err != nil {
		return err
	}
	if w.json {
		data, err := json.Marshal(l)
		if err != nil {
			return err
		}
		w.pending.Write(data)
	} else {
		w.pending.WriteString(l.Line)
	}
	w.pending.WriteByte('\n')
	return nil
}

func (w *lineWriter) flush() error {
	_, err := w.out.Write(w.pending.Bytes())
	w.pending.Reset()
	return err
}

// printArtifacts lists the outputs a result names as stored objects.
func printArtifacts(w io.Writer, r *job.Result) {
	names := make([]string, 0, len(r.Artifacts))
	for n := range r.Artifacts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		a := r.Artifacts[n]
		fmt.Fprintf(w, "output %s: %d bytes, sha256 %s (fleetctl output %s %s)\n", n, a.Size, a.SHA256, r.JobID, n)
	}
	if r.Log != nil && r.Log.Truncated {
		fmt.Fprintf(w, "log: truncated at %d bytes (%d lines kept, %d left out)\n", r.Log.Limit, r.Log.Lines, r.Log.DroppedLines)
	}
}
