package artifact

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// newStore starts a NATS server, sets the fleet's streams and buckets up
// as a dispatcher does, and returns a Store with small chunks, so that
// objects of a few kilobytes span many of them.
func newStore(t testing.TB, cfg Config) (*Store, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Run(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := queue.Setup(ctx, js, queue.Config{}, nil); err != nil {
		t.Fatal(err)
	}
	return New(js, cfg), js
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func readAll(t testing.TB, s *Store, bucket, key string, want Expect) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := s.Open(ctx, bucket, key, want)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func TestPutThenOpenGivesBackTheBytes(t *testing.T) {
	const chunk = 1024
	s, js := newStore(t, Config{ChunkSize: chunk, Window: 3})
	ctx := context.Background()
	for _, n := range []int{0, 1, chunk - 1, chunk, chunk + 1, 7*chunk + 13, 40 * chunk} {
		data := randomBytes(t, n)
		key := OutputKey("t1", "j", 1, fmt.Sprintf("sizes/%d.bin", n))
		info, err := s.Put(ctx, s.Artifacts(), key, bytes.NewReader(data), PutOptions{ContentType: "application/x-test"})
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if info.Size != int64(n) || info.SHA256 != hexSum(data) {
			t.Fatalf("%d bytes: put says %d bytes, %s", n, info.Size, info.SHA256)
		}
		got, err := readAll(t, s, s.Artifacts(), key, Expect{SHA256: hexSum(data)})
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: read back %d bytes, %v", n, len(got), err)
		}
		st, err := s.Stat(ctx, s.Artifacts(), key)
		if err != nil || st.ContentType != "application/x-test" || st.Size != int64(n) {
			t.Fatalf("%d bytes: stat %+v, %v", n, st, err)
		}
		// The object store's own client reads it: the format is its own.
		obs, err := js.ObjectStore(ctx, s.Artifacts())
		if err != nil {
			t.Fatal(err)
		}
		lib, err := obs.GetBytes(ctx, key)
		if err != nil || !bytes.Equal(lib, data) {
			t.Fatalf("%d bytes: the object store client reads %d bytes, %v", n, len(lib), err)
		}
	}
	// What it writes names its chunks as it likes, not by the object's
	// tenant: this package refuses it, saying why.
	obs, err := js.ObjectStore(ctx, s.Uploads())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, "lib/put.bin", randomBytes(t, 3000)); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(t, s, s.Uploads(), "lib/put.bin", Expect{}); err == nil || !strings.Contains(err.Error(), "not named as the fleet names them") {
		t.Fatalf("read what the object store client wrote: %v", err)
	}
}

func TestChunksAreNamedByTheObjectsTenant(t *testing.T) {
	s, js := newStore(t, Config{ChunkSize: 1024})
	ctx := context.Background()
	for _, tc := range []struct{ bucket, key, tenant string }{
		{s.ArtifactsOf("gpu"), OutputKey("acme", "j1", 1, "out.bin"), "acme"},
		{s.ArtifactsOf("gpu"), LogKey("acme", "j1", 1), "acme"},
		{s.UploadsOf("acme"), "any/key.bin", "acme"},
	} {
		if tc.bucket != s.Uploads() {
			if err := queue.EnsureObjectStore(ctx, js, queue.Config{}.ArtifactsStore("gpu"), nil); err != nil {
				t.Fatal(err)
			}
			if err := queue.EnsureObjectStore(ctx, js, queue.Config{}.UploadsStore("acme"), nil); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Put(ctx, tc.bucket, tc.key, bytes.NewReader(randomBytes(t, 2500)), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, "OBJ_"+tc.bucket)
		if err != nil {
			t.Fatal(err)
		}
		id := chunkID(tc.tenant, tc.bucket, tc.key)
		for n := range 3 {
			subj := fmt.Sprintf("$O.%s.C.%s.%d", tc.bucket, id, n)
			if !strings.HasPrefix(subj, "$O."+tc.bucket+".C."+tc.tenant+".") {
				t.Fatalf("chunk subject %s does not start with its tenant", subj)
			}
			if _, err := st.GetLastMsgForSubject(ctx, subj); err != nil {
				t.Errorf("%s/%s: chunk %d: %v", tc.bucket, tc.key, n, err)
			}
		}
	}
	// A pool's bucket holds outputs and logs of a named tenant only.
	if _, err := s.Put(ctx, s.ArtifactsOf("gpu"), "elsewhere/x", strings.NewReader("x"), PutOptions{}); err == nil ||
		!strings.Contains(err.Error(), "outputs/<tenant>") {
		t.Errorf("a key of no tenant in a pool's bucket: %v", err)
	}
}

func TestReadingWithoutDescriptions(t *testing.T) {
	s, js := newStore(t, Config{ChunkSize: 1024, Window: 3})
	ctx := context.Background()
	tenant := New(js, Config{ChunkSize: 1024, Window: 3, NoDescriptions: true})
	data := randomBytes(t, 7*1024+5)
	info, err := s.Put(ctx, s.Artifacts(), OutputKey("t1", "j", 1, "out.bin"), bytes.NewReader(data), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	art := info.Artifact()
	res := &job.Result{JobID: "j", Artifacts: map[string]job.Artifact{"out.bin": art}}
	o, err := OpenOutput(ctx, tenant, res, "out.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(o)
	o.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("output read by reference: %d bytes, %v", len(got), err)
	}
	// A reference that does not match the chunks fails the read.
	wrong := art
	wrong.SHA256 = hexSum([]byte("x"))
	if _, err := readRef(tenant, wrong); !errors.Is(err, ErrChanged) {
		t.Errorf("wrong digest: %v, want ErrChanged", err)
	}
	short := art
	short.Size--
	if _, err := readRef(tenant, short); !errors.Is(err, ErrChanged) {
		t.Errorf("wrong size: %v, want ErrChanged", err)
	}
	gone := art
	gone.Key = OutputKey("t1", "j", 1, "never.bin")
	if _, err := readRef(tenant, gone); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing object: %v, want ErrNotFound", err)
	}

	// A log, complete or being written, is read by its chunks alone.
	k := queue.JobKey{Tenant: "t1", Pool: "default", ID: "j"}
	w := s.NewLog(ctx, k, 1, LogOptions{})
	w.Line(time.Now(), StreamStdout, "one")
	over := false
	r, err := tenant.OpenLog(ctx, k, 1, ReadLogOptions{Follow: true, Poll: 50 * time.Millisecond,
		Ended: func(context.Context) (bool, error) { return over, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	br := bufio.NewReader(r)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasSuffix(line, " stdout one\n") {
		t.Fatalf("first line %q, %v", line, err)
	}
	for i := range 100 {
		w.Line(time.Now(), StreamStdout, fmt.Sprintf("more %d", i))
	}
	if _, err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	over = true
	if rest := readLines(t, br); len(rest) != 100 {
		t.Fatalf("after the attempt: %d lines, want 100", len(rest))
	}
	whole, err := tenant.OpenLog(ctx, k, 1, ReadLogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lines := readLines(t, whole); len(lines) != 101 {
		t.Fatalf("the whole log: %d lines", len(lines))
	}
}

func readRef(s *Store, a job.Artifact) ([]byte, error) {
	r, err := s.OpenRef(context.Background(), a.Bucket, a.Key, a.Size, a.SHA256)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func TestPutReplacesAnObjectWhole(t *testing.T) {
	s, _ := newStore(t, Config{ChunkSize: 512})
	ctx := context.Background()
	first, second := randomBytes(t, 5000), randomBytes(t, 1200)
	for _, data := range [][]byte{first, second} {
		if _, err := s.Put(ctx, s.Uploads(), "same", bytes.NewReader(data), PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readAll(t, s, s.Uploads(), "same", Expect{})
	if err != nil || !bytes.Equal(got, second) {
		t.Fatalf("read %d bytes, %v; want the second object's 1200", len(got), err)
	}
}

// failingReader yields n bytes, then fails.
type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, errors.New("disk on fire")
	}
	n := min(len(p), f.n)
	f.n -= n
	return n, nil
}

func TestAFailedPutLeavesNothing(t *testing.T) {
	s, js := newStore(t, Config{ChunkSize: 1024})
	ctx := context.Background()
	big, broken := OutputKey("t1", "j", 1, "big"), OutputKey("t1", "j", 1, "broken")
	_, err := s.Put(ctx, s.Artifacts(), big, bytes.NewReader(randomBytes(t, 10_000)), PutOptions{MaxBytes: 4096})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "4096") {
		t.Fatalf("put over the limit: %v", err)
	}
	if _, err := s.Put(ctx, s.Artifacts(), broken, &failingReader{n: 5000}, PutOptions{}); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("put from a failing reader: %v", err)
	}
	for _, key := range []string{big, broken} {
		if _, err := s.Stat(ctx, s.Artifacts(), key); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: %v, want not found", key, err)
		}
	}
	// Their chunks were purged: the bucket's stream holds nothing.
	st, err := js.Stream(ctx, "OBJ_"+s.Artifacts())
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := st.Info(ctx); info.State.Msgs != 0 {
		t.Errorf("%d messages left in the bucket's stream", info.State.Msgs)
	}
}

func TestReadsCheckTheDigest(t *testing.T) {
	s, _ := newStore(t, Config{ChunkSize: 1024})
	ctx := context.Background()
	data := randomBytes(t, 5000)
	info, err := s.Put(ctx, s.Uploads(), "in.bin", bytes.NewReader(data), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	size := info.Size
	wrong := int64(4999)
	for _, want := range []Expect{{SHA256: strings.Repeat("0", 64)}, {Size: &wrong}} {
		if _, err := readAll(t, s, s.Uploads(), "in.bin", want); !errors.Is(err, ErrChanged) {
			t.Errorf("expect %+v: %v, want ErrChanged", want, err)
		}
	}
	if got, err := readAll(t, s, s.Uploads(), "in.bin", Expect{SHA256: info.SHA256, Size: &size}); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("matching expectation: %v", err)
	}
	// A description whose digest does not match the chunks: the read fails
	// at its end, and FetchFile leaves no file.
	bad := *info
	bad.SHA256 = hexSum([]byte("something else"))
	bad.id = info.id
	tamper(t, s, &bad)
	if _, err := readAll(t, s, s.Uploads(), "in.bin", Expect{}); !errors.Is(err, ErrChanged) {
		t.Fatalf("tampered object: %v, want ErrChanged", err)
	}
	dir := t.TempDir()
	if _, err := s.FetchFile(ctx, s.Uploads(), "in.bin", Expect{}, filepath.Join(dir, "in.bin"), 0o444); !errors.Is(err, ErrChanged) {
		t.Fatalf("fetch a tampered object: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a failed fetch left %v", entries)
	}
}

func TestNamesAndBucketsAreChecked(t *testing.T) {
	s, _ := newStore(t, Config{})
	ctx := context.Background()
	for _, tc := range []struct{ bucket, key, want string }{
		{"other-bucket", "k", "not one of the fleet's"},
		{s.Uploads(), "../etc/passwd", `".." segment`},
		{s.Uploads(), "/abs", "absolute"},
		{s.Uploads(), "a\x00b", "control character"},
	} {
		if _, err := s.Put(ctx, tc.bucket, tc.key, strings.NewReader("x"), PutOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("put %s/%q: %v, want %q", tc.bucket, tc.key, err, tc.want)
		}
		if _, err := s.Stat(ctx, tc.bucket, tc.key); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("stat %s/%q: %v, want %q", tc.bucket, tc.key, err, tc.want)
		}
	}
	if _, err := s.Stat(ctx, s.Uploads(), "never/put"); !errors.Is(err, ErrNotFound) {
		t.Errorf("stat of a missing object: %v", err)
	}
}

func TestFetchInputsWritesWholeCheckedFiles(t *testing.T) {
	s, _ := newStore(t, Config{ChunkSize: 1024})
	ctx := context.Background()
	data := randomBytes(t, 10_000)
	info, err := s.Put(ctx, s.Uploads(), "u/data.bin", bytes.NewReader(data), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// An output of another job may be an input too.
	out, err := s.Put(ctx, s.Artifacts(), OutputKey(job.DefaultTenant, "prev", 1, "model.bin"), strings.NewReader("weights"), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(refs map[string]job.InputRef, lim Limits) (string, error) {
		dir := t.TempDir()
		a := s.Attempt("j", 1, &job.Request{InputRefs: refs}, AttemptOptions{Limits: lim})
		return dir, a.FetchInputs(ctx, dir)
	}
	ok := map[string]job.InputRef{
		"sub/data.bin": info.InputRef(),
		"model.bin":    {Bucket: s.Artifacts(), Key: out.Key, SHA256: out.SHA256},
	}
	dir, err := fetch(ok, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "sub", "data.bin"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes, %v", len(got), err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "sub", "data.bin")); fi.Mode().Perm() != 0o444 {
		t.Errorf("input mode %s, want read-only", fi.Mode())
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "model.bin")); string(got) != "weights" {
		t.Errorf("output of another job as input: %q", got)
	}

	size := info.Size + 1
	for _, tc := range []struct {
		ref   job.InputRef
		lim   Limits
		class job.FailureClass
		code  job.FailureCode
		says  string
	}{
		{job.InputRef{Key: "u/missing.bin", SHA256: info.SHA256}, Limits{}, job.ClassRejected, job.CodeInputMissing, "no object u/missing.bin"},
		{job.InputRef{Key: "u/data.bin", SHA256: hexSum([]byte("x"))}, Limits{}, job.ClassRejected, job.CodeInputChanged, "SHA-256"},
		{job.InputRef{Key: "u/data.bin", SHA256: info.SHA256, Size: &size}, Limits{}, job.ClassRejected, job.CodeInputChanged, "10000 bytes, not 10001"},
		{job.InputRef{Bucket: "elsewhere", Key: "u/data.bin", SHA256: info.SHA256}, Limits{}, job.ClassRejected, job.CodeInvalid, "not one of the fleet's"},
		// Another tenant's objects are not a job's to read.
		{job.InputRef{Bucket: s.UploadsOf("acme"), Key: "u/data.bin", SHA256: info.SHA256}, Limits{}, job.ClassRejected, job.CodeInvalid, "tenant acme's"},
		{job.InputRef{Bucket: s.Artifacts(), Key: OutputKey("acme", "prev", 1, "model.bin"), SHA256: out.SHA256}, Limits{}, job.ClassRejected, job.CodeInvalid, "not an output of tenant default"},
		{info.InputRef(), Limits{MaxInputBytes: 9999}, job.ClassRejected, job.CodeInvalid, "over the limit of 9999"},
	} {
		dir, err := fetch(map[string]job.InputRef{"in.bin": tc.ref}, tc.lim)
		var f *job.Failure
		if !errors.As(err, &f) || f.Class != tc.class || f.Code != tc.code || !strings.Contains(f.Message, tc.says) {
			t.Errorf("%+v: %v, want %s/%s saying %q", tc.ref, err, tc.class, tc.code, tc.says)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%+v: left %v in the inputs", tc.ref, entries)
		}
	}
}

func TestStoreOutputNamesItsLimits(t *testing.T) {
	s, _ := newStore(t, Config{ChunkSize: 1024})
	ctx := context.Background()
	a := s.Attempt("j1", 2, &job.Request{}, AttemptOptions{Limits: Limits{MaxOutputBytes: 3000, MaxJobOutputBytes: 5000}})
	art, err := a.StoreOutput(ctx, "report.json", bytes.NewReader(make([]byte, 2500)), 2500)
	if err != nil {
		t.Fatal(err)
	}
	if art.Key != "outputs/default/j1/2/report.json" || art.Bucket != s.Artifacts() || art.Size != 2500 || art.ContentType != "application/json" {
		t.Errorf("artifact %+v", art)
	}
	for _, tc := range []struct {
		size int64
		says string
	}{
		{3001, "over the limit of 3000 bytes per output (--max-artifact-bytes)"},
		{2501, "over the limit of 5000 bytes together (--max-job-artifact-bytes"},
	} {
		_, err := a.StoreOutput(ctx, "more.bin", bytes.NewReader(make([]byte, tc.size)), tc.size)
		var f *job.Failure
		if !errors.As(err, &f) || f.Code != job.CodeOutputLarge || !strings.Contains(f.Message, tc.says) {
			t.Errorf("%d bytes: %v, want output_too_large saying %q", tc.size, err, tc.says)
		}
	}
	// A file that grows past what was announced is cut off too.
	_, err = a.StoreOutput(ctx, "growing.bin", bytes.NewReader(make([]byte, 2600)), 100)
	if f := (*job.Failure)(nil); !errors.As(err, &f) || f.Code != job.CodeOutputLarge {
		t.Errorf("growing output: %v", err)
	}
}

// readLines reads a whole log and parses its lines.
func readLines(t testing.TB, r io.Reader) []LogLine {
	t.Helper()
	var lines []LogLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		l, err := ParseLogLine(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// logOf is the job whose logs the tests write.
var logOf = queue.JobKey{Tenant: "t1", Pool: job.DefaultPool, ID: "j"}

func TestLogKeepsEveryLineInOrder(t *testing.T) {
	s, _ := newStore(t, Config{ChunkSize: 4096})
	ctx := context.Background()
	w := s.NewLog(ctx, logOf, 1, LogOptions{})
	const n = 20_000
	t0 := time.Now()
	for i := range n {
		stream := StreamStdout
		if i%7 == 0 {
			stream = StreamStderr
		}
		w.Line(t0.Add(time.Duration(i)*time.Microsecond), stream, fmt.Sprintf("line %06d é", i))
	}
	sum, err := w.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Lines != n || sum.Truncated || sum.DroppedLines != 0 {
		t.Fatalf("summary %+v", sum)
	}
	r, err := s.OpenLog(ctx, logOf, 1, ReadLogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Info() == nil || r.Info().Size != sum.Bytes {
		t.Errorf("a closed log reads as a whole object of %d bytes: %+v", sum.Bytes, r.Info())
	}
	lines := readLines(t, r)
	if len(lines) != n {
		t.Fatalf("%d lines, want %d", len(lines), n)
	}
	for i, l := range lines {
		want := fmt.Sprintf("line %06d é", i)
		if l.Line != want || (i%7 == 0) != (l.Stream == StreamStderr) || !l.Time.Equal(t0.Add(time.Duration(i)*time.Microsecond).Truncate(time.Microsecond)) {
			t.Fatalf("line %d: %+v, want %q", i, l, want)
		}
	}
	// An attempt that printed nothing stored nothing, and reads empty.
	empty := s.NewLog(ctx, logOf, 2, LogOptions{})
	if sum, err := empty.Close(ctx); err != nil || sum.Lines != 0 {
		t.Fatalf("empty log: %+v, %v", sum, err)
	}
	r, err = s.OpenLog(ctx, logOf, 2, ReadLogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(r); err != nil || len(b) != 0 {
		t.Fatalf("empty log reads %q, %v", b, err)
	}
}

func TestLogIsTruncatedAtItsLimit(t *testing.T) {
	s, _ := newStore(t, Config{ChunkSize: 1024})
	ctx := context.Background()
	w := s.NewLog(ctx, logOf, 1, LogOptions{MaxBytes: 10_000})
	for i := range 1000 {
		w.Line(time.Now(), StreamStdout, fmt.Sprintf("line %04d", i))
	}
	sum, err := w.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Truncated || sum.Bytes > 10_000 || sum.Lines+sum.DroppedLines != 1000 || sum.Lines < 100 {
		t.Fatalf("summary %+v", sum)
	}
	r, err := s.OpenLog(ctx, logOf, 1, ReadLogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, r)
	if int64(len(lines)) != sum.Lines+1 {
		t.Fatalf("%d lines, want %d and the note", len(lines), sum.Lines)
	}
	last := lines[len(lines)-1]
	if last.Stream != StreamFleet || !strings.Contains(last.Line, "limit of 10000 bytes (--max-log-bytes)") {
		t.Errorf("last line %+v", last)
	}
	for i, l := range lines[:len(lines)-1] {
		if l.Line != fmt.Sprintf("line %04d", i) {
			t.Fatalf("line %d: %q", i, l.Line)
		}
	}
}

func TestLogCanBeFollowedAndSurvivesItsWriter(t *testing.T) {
	s, _ := newStore(t, Config{ChunkSize: 1024})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Follow a log as it is written, slowly: lines reach the follower
	// before the log is closed, and the follower ends once it is.
	w := s.NewLog(ctx, logOf, 1, LogOptions{})
	w.Line(time.Now(), StreamStdout, "first")
	ended := func(context.Context) (bool, error) { return false, nil }
	r, err := s.OpenLog(ctx, logOf, 1, ReadLogOptions{Follow: true, Ended: ended, Poll: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	br := bufio.NewReader(r)
	first, err := br.ReadString('\n')
	if err != nil || !strings.HasSuffix(first, " stdout first\n") {
		t.Fatalf("first line %q, %v", first, err)
	}
	w.Line(time.Now(), StreamStderr, "second")
	second, err := br.ReadString('\n')
	if err != nil || !strings.HasSuffix(second, " stderr second\n") {
		t.Fatalf("second line %q, %v", second, err)
	}
	for i := range 300 {
		w.Line(time.Now(), StreamStdout, fmt.Sprintf("more %d", i))
	}
	if _, err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rest := readLines(t, br)
	if len(rest) != 300 || rest[299].Line != "more 299" {
		t.Fatalf("after closing: %d lines", len(rest))
	}

	// A writer that dies (a worker SIGKILLed) writes no description: what
	// it stored is read as it is, and a follower stops once the attempt
	// is over.
	lost := s.NewLog(ctx, logOf, 2, LogOptions{})
	for i := range 50 {
		lost.Line(time.Now(), StreamStdout, fmt.Sprintf("lost %d", i))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := s.OpenLog(ctx, logOf, 2, ReadLogOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lines := readLines(t, r)
		r.Close()
		if len(lines) == 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lost attempt's stored lines: %d, want 50", len(lines))
		}
		time.Sleep(100 * time.Millisecond)
	}
	over := false
	r2, err := s.OpenLog(ctx, logOf, 2, ReadLogOptions{Follow: true, Poll: 100 * time.Millisecond,
		Ended: func(context.Context) (bool, error) { return over, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	over = true
	if lines := readLines(t, r2); len(lines) != 50 {
		t.Fatalf("following a lost attempt's log: %d lines", len(lines))
	}

	// A rerun of an attempt (handed back) starts its log afresh.
	rerun := s.NewLog(ctx, logOf, 2, LogOptions{PurgeFirst: true})
	rerun.Line(time.Now(), StreamStdout, "again")
	if _, err := rerun.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r3, err := s.OpenLog(ctx, logOf, 2, ReadLogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lines := readLines(t, r3); len(lines) != 1 || lines[0].Line != "again" {
		t.Fatalf("rerun's log: %+v", lines)
	}
}

// tamper stores a description of an object as someone with write access to
// the bucket could: with the chunks of info, and its digest.
func tamper(t *testing.T, s *Store, info *Info) {
	t.Helper()
	oi := jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: info.Key}, Bucket: info.Bucket, NUID: info.id + ".*",
		Size: uint64(info.Size), Chunks: uint32(info.chunks), Digest: objectDigest(mustHex(info.SHA256))}
	data, err := json.Marshal(oi)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.js.Publish(context.Background(), metaSubject(info.Bucket, info.Key), data); err != nil {
		t.Fatal(err)
	}
}
