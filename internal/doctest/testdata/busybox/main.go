// Command busybox is the stand-in for busybox:1.36 that the README's test
// builds when the Docker daemon has no such image (no registry here): one
// static program on FROM scratch, installed as /bin/echo, /bin/true,
// /bin/false, /bin/sleep and /bin/cat, each doing what its name says for
// the examples' arguments.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	args := os.Args[1:]
	switch filepath.Base(os.Args[0]) {
	case "echo":
		fmt.Println(strings.Join(args, " "))
	case "true":
	case "false":
		os.Exit(1)
	case "sleep":
		for _, a := range args {
			d, err := time.ParseDuration(a)
			if err != nil {
				d, err = time.ParseDuration(a + "s")
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "sleep: invalid time interval", a)
				os.Exit(1)
			}
			time.Sleep(d)
		}
	case "cat":
		if len(args) == 0 {
			_, _ = io.Copy(os.Stdout, os.Stdin)
		}
		for _, a := range args {
			f, err := os.Open(a)
			if err != nil {
				fmt.Fprintln(os.Stderr, "cat:", err)
				os.Exit(1)
			}
			_, _ = io.Copy(os.Stdout, f)
			f.Close()
		}
	default:
		fmt.Fprintf(os.Stderr, "%s: applet not found (this is the fleet tests' stand-in for busybox)\n", os.Args[0])
		os.Exit(127)
	}
}
