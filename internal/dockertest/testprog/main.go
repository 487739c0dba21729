// Command testprog is the one program of the Docker test image: a static
// binary on FROM scratch, so that the image builds without a registry. Its
// arguments are steps, run in order; each step takes a fixed number of
// arguments:
//
//	echo TEXT        print TEXT on stdout
//	stderr TEXT      print TEXT on stderr
//	copy SRC DST     copy file SRC to DST
//	write PATH TEXT  write TEXT to file PATH
//	fill PATH BYTES  write BYTES bytes to file PATH
//	random PATH BYTES SEED  write BYTES pseudo-random bytes to file PATH:
//	                 ChaCha8 keyed with the SHA-256 of SEED (see RandomBytes)
//	lines N          print N lines on stdout: "line 1" to "line N"
//	env NAME         print the value of NAME, or "<unset>"
//	env-to NAME PATH write the value of NAME, or "<unset>", to file PATH
//	pwd-to PATH      write the working directory to file PATH
//	writable DIR PATH  write "writable" to file PATH if a file can be
//	                 created in DIR, else "read-only"
//	self             print uid, gid, effective capabilities and NoNewPrivs
//	ignore-term      ignore SIGTERM from now on
//	alloc BYTES      allocate and touch BYTES of memory, and keep it
//	sleep DURATION   sleep for a Go duration
//	spin DURATION    keep one CPU busy for a Go duration
//	resume PATH      if file PATH exists, print its content; otherwise
//	                 write "1" to it and exit 1 (a job that checkpoints)
//	spawn DURATION   start a copy of itself that sleeps for DURATION, in the
//	                 background, with the same output and signal dispositions
//	exit CODE        exit with CODE
//
// Environment variables in paths are expanded ("$FLEET_OUTPUTS/out.txt"),
// so that one program runs in a container and as a local process.
//
// Invoked as "true" (the image has it as /bin/true), it exits 0 at once.
package main

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var kept [][]byte // memory that alloc holds on to

func main() {
	if filepath.Base(os.Args[0]) == "true" {
		return
	}
	args := os.Args[1:]
	for len(args) > 0 {
		verb := args[0]
		n, ok := arity[verb]
		if !ok || len(args) < 1+n {
			fail("usage: step %q is unknown or misses arguments", verb)
		}
		step(verb, args[1:1+n])
		args = args[1+n:]
	}
}

var arity = map[string]int{
	"echo": 1, "stderr": 1, "copy": 2, "write": 2, "fill": 2, "env": 1, "self": 0,
	"ignore-term": 0, "alloc": 1, "sleep": 1, "exit": 1,
	"env-to": 2, "pwd-to": 1, "writable": 2, "spawn": 1, "random": 3, "lines": 1, "spin": 1, "resume": 1,
}

func step(verb string, a []string) {
	switch verb {
	case "echo":
		fmt.Println(a[0])
	case "stderr":
		fmt.Fprintln(os.Stderr, a[0])
	case "copy":
		data, err := os.ReadFile(os.ExpandEnv(a[0]))
		check(err)
		check(os.WriteFile(os.ExpandEnv(a[1]), data, 0o644))
	case "write":
		check(os.WriteFile(os.ExpandEnv(a[0]), []byte(a[1]), 0o644))
	case "fill":
		f, err := os.Create(os.ExpandEnv(a[0]))
		check(err)
		_, err = io.CopyN(f, zeros{}, number(a[1]))
		check(err)
		check(f.Close())
	case "random":
		f, err := os.Create(os.ExpandEnv(a[0]))
		check(err)
		w := bufio.NewWriterSize(f, 1<<20)
		_, err = io.CopyN(w, randomBytes(a[2]), number(a[1]))
		check(err)
		check(w.Flush())
		check(f.Close())
	case "lines":
		w := bufio.NewWriterSize(os.Stdout, 64<<10)
		for i := int64(1); i <= number(a[0]); i++ {
			_, err := fmt.Fprintf(w, "line %d\n", i)
			check(err)
		}
		check(w.Flush())
	case "env":
		v, ok := os.LookupEnv(a[0])
		if !ok {
			v = "<unset>"
		}
		fmt.Println(v)
	case "env-to":
		v, ok := os.LookupEnv(a[0])
		if !ok {
			v = "<unset>"
		}
		check(os.WriteFile(os.ExpandEnv(a[1]), []byte(v), 0o644))
	case "pwd-to":
		wd, err := os.Getwd()
		check(err)
		check(os.WriteFile(os.ExpandEnv(a[0]), []byte(wd), 0o644))
	case "writable":
		state := "read-only"
		probe := filepath.Join(os.ExpandEnv(a[0]), ".testprog-probe")
		if f, err := os.OpenFile(probe, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
			f.Close()
			os.Remove(probe)
			state = "writable"
		}
		check(os.WriteFile(os.ExpandEnv(a[1]), []byte(state), 0o644))
	case "spawn":
		self, err := os.Executable()
		check(err)
		cmd := exec.Command(self, "sleep", a[0])
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		check(cmd.Start())
	case "self":
		fmt.Printf("uid=%d gid=%d\n", os.Getuid(), os.Getgid())
		f, err := os.Open("/proc/self/status")
		check(err)
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && (k == "CapEff" || k == "CapPrm" || k == "NoNewPrivs") {
				fmt.Printf("%s=%s\n", k, strings.TrimSpace(v))
			}
		}
		f.Close()
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
	case "alloc":
		b := make([]byte, number(a[0]))
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		kept = append(kept, b)
	case "sleep":
		d, err := time.ParseDuration(a[0])
		check(err)
		time.Sleep(d)
	case "spin":
		d, err := time.ParseDuration(a[0])
		check(err)
		n := 0
		for end := time.Now().Add(d); time.Now().Before(end); {
			n++
		}
		_ = n
	case "resume":
		p := os.ExpandEnv(a[0])
		data, err := os.ReadFile(p)
		if err == nil {
			fmt.Println(string(data))
			return
		}
		check(os.WriteFile(p, []byte("1"), 0o644))
		fmt.Println("checkpoint written")
		os.Exit(1)
	case "exit":
		os.Exit(int(number(a[0])))
	}
}

// randomBytes is the stream of the random step: ChaCha8 keyed with the
// SHA-256 of seed, which a test can compute again.
func randomBytes(seed string) io.Reader {
	return rand.NewChaCha8(sha256.Sum256([]byte(seed)))
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func number(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	check(err)
	return n
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testprog: "+format+"\n", args...)
	os.Exit(100)
}
