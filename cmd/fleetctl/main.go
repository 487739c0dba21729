// Command fleetctl submits jobs to a fleet, follows them and cancels them.
//
//	fleetctl [global flags] COMMAND [flags] [args]
//	fleetctl submit -f job.json [--input NAME=@FILE] [--wait] [-o json]
//	fleetctl status ID | watch ID | cancel ID
//	fleetctl upload FILE [--name N] | output ID NAME [-o FILE] | logs ID [--attempt N] [--follow]
//	fleetctl run submit -f run.json [--wait] | run show|watch|cancel|retry RUN | run list
//
// Exit codes, for scripts: 0 success; 1 the job (or the run) ended
// without succeeding (failed, timed out, cancelled); 2 bad usage or a
// rejected request; 3 no such job (or run); 4 the fleet could not be
// reached or answered with an error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/cli"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Exit codes.
const (
	exitOK       = 0
	exitJobFail  = 1
	exitUsage    = 2
	exitNotFound = 3
	exitFleet    = 4
)

// exitError carries an exit code up to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exit(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

type command struct {
	name, args, help string
	run              func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error
	flags            func(fs *flag.FlagSet)
	// example shows the command at work, a line or two per use (each verb
	// of a command that has verbs), as its -h prints them.
	example string
	// verbs are the command's own subcommands (pool show, pool set …).
	verbs []string
	// fileOutput: the command's -o names a file, not the output format.
	fileOutput bool
}

var commands []*command

func main() {
	code := run(os.Args[1:], os.Stdout, os.Stderr)
	os.Exit(code)
}

func run(args []string, stdout, stderr io.Writer) int {
	lead, name, rest, help, err := splitCommand(args)
	if err != nil {
		fmt.Fprintln(stderr, "fleetctl:", err)
		return exitUsage
	}
	if name == "help" && len(rest) > 0 && rest[0] != "help" {
		// fleetctl help COMMAND, as git and kubectl take it.
		name, rest, help = rest[0], nil, true
	}
	if name == "" || name == "help" {
		if name == "" && !help && len(args) > 0 {
			fmt.Fprintln(stderr, "fleetctl: no command given")
		}
		usage(stderr)
		if help || name == "help" {
			return exitOK
		}
		return exitUsage
	}
	var cmd *command
	for _, c := range commands {
		if c.name == name {
			cmd = c
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "fleetctl: unknown command %q\n", name)
		usage(stderr)
		return exitUsage
	}
	e := &env{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("fleetctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	e.globalFlags(fs, cmd.fileOutput)
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	synopsis := fmt.Sprintf("usage: fleetctl [global flags] %s %s\n\n%s", cmd.name, cmd.args, cmd.help)
	if cmd.example != "" {
		synopsis += "\n\nExamples:\n" + indent(cmd.example)
		synopsis = strings.TrimRight(synopsis, "\n")
	}
	fs.Usage = cli.Usage(fs, synopsis)
	cmdArgs := append(lead, rest...)
	if help {
		cmdArgs = append(cmdArgs, "-h")
	}
	if err := cli.Parse(fs, interleave(fs, cmdArgs)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	e.token = os.Getenv("FLEET_API_TOKEN")
	if e.tokenFile != "" {
		tok, err := queue.FileSecret(e.tokenFile)
		if err != nil {
			fmt.Fprintln(stderr, "fleetctl: --api-token-file:", err)
			return exitUsage
		}
		e.token = tok
	}
	if e.output != "text" && e.output != "json" {
		fmt.Fprintf(stderr, "fleetctl: -o %q: use text or json\n", e.output)
		return exitUsage
	}
	ctx, _, stop := cli.SignalContext()
	defer stop()
	defer e.close()
	err = cmd.run(ctx, e, fs, fs.Args())
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(stderr, "fleetctl:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "fleetctl:", err)
	if errors.Is(err, client.ErrNotFound) || errors.Is(err, client.ErrNoObject) {
		return exitNotFound
	}
	return exitFleet
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fleetctl [global flags] COMMAND [flags] [args]\n\nCommands:")
	sorted := append([]*command(nil), commands...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	for _, c := range sorted {
		fmt.Fprintf(w, "  %-9s %-22s %s\n", c.name, c.args, firstLine(c.help))
	}
	var globals []string
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	(&env{}).globalFlags(fs, false)
	fs.VisitAll(func(f *flag.Flag) {
		if len(f.Name) == 1 {
			globals = append(globals, "-"+f.Name)
		} else {
			globals = append(globals, "--"+f.Name)
		}
	})
	fmt.Fprintf(w, "\nGlobal flags, before or after the command:\n%s\n", wrap(strings.Join(globals, " "), 76, "  "))
	fmt.Fprintln(w, "\nRun 'fleetctl COMMAND -h' or 'fleetctl help COMMAND' for a command's flags and examples.\n"+
		"Every flag also reads FLEET_<FLAG>.")
}

// wrap breaks s into lines of at most width characters, each after prefix.
func wrap(s string, width int, prefix string) string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, prefix+line)
			line = ""
		}
		line = strings.TrimPrefix(line+" "+word, " ")
	}
	if line != "" {
		lines = append(lines, prefix+line)
	}
	return strings.Join(lines, "\n")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// globalFlags adds the flags every command takes, before or after its name.
// fileOutput: the command's -o names a file, and is its own flag.
func (e *env) globalFlags(fs *flag.FlagSet, fileOutput bool) {
	e.nats.Register(fs)
	fs.StringVar(&e.prefix, "subject-prefix", queue.DefaultPrefix, "prefix of the fleet's subjects")
	fs.StringVar(&e.tenant, "tenant", job.DefaultTenant, "the tenant to act as, named in the subjects of its requests (fleet.t.<tenant>.…): on an open fleet any; on an authenticated fleet, the one the NATS user may act as")
	e.output = "text"
	if !fileOutput {
		fs.StringVar(&e.output, "o", "text", "output format: text or json")
	}
	fs.StringVar(&e.httpAddr, "http-addr", "127.0.0.1:8080", "the dispatcher's HTTP API (capacity and workers)")
	fs.StringVar(&e.tokenFile, "api-token-file", "", "file holding a bearer token for the HTTP API (or set FLEET_API_TOKEN)")
}

// splitCommand finds the command's name in args. The global flags may come
// before it, as the nats CLI, kubectl, docker and git take them
// ("fleetctl --tenant acme submit -f job.json"); lead are those flags, with
// their values, and rest is what follows the name. help is set when -h or
// --help came before the name. A flag before the name that is not a global
// one is an error: whether it takes a value depends on the command.
func splitCommand(args []string) (lead []string, name string, rest []string, help bool, err error) {
	globals := flag.NewFlagSet("", flag.ContinueOnError)
	(&env{}).globalFlags(globals, false)
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			if i+1 < len(args) {
				return lead, args[i+1], args[i+2:], help, nil
			}
			break
		}
		if a == "-" || !strings.HasPrefix(a, "-") {
			return lead, a, args[i+1:], help, nil
		}
		flagName, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if flagName == "h" || flagName == "help" {
			help = true
			continue
		}
		f := globals.Lookup(flagName)
		if f == nil {
			return nil, "", nil, false, fmt.Errorf("%s before the command is not a global flag: give a command's own flags after its name (fleetctl COMMAND %s …)", a, a)
		}
		lead = append(lead, a)
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); hasValue || ok && bf.IsBoolFlag() {
			continue
		}
		if i+1 == len(args) {
			return nil, "", nil, false, fmt.Errorf("flag needs an argument: %s", a)
		}
		lead = append(lead, args[i+1])
		i++
	}
	return lead, "", nil, help, nil
}

// interleave lets flags follow positional arguments ("status ID -o json"),
// as users type them.
func interleave(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) > 1 && a[0] == '-' && a != "-" {
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil {
				if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
					continue
				}
				if i+1 < len(args) {
					flags = append(flags, args[i+1])
					i++
				}
			}
			continue
		}
		pos = append(pos, a)
	}
	return append(flags, pos...)
}

// env is what every command may use.
type env struct {
	stdout, stderr io.Writer
	nats           cli.NATSFlags
	prefix         string
	tenant         string
	output         string
	httpAddr       string
	token          string
	tokenFile      string

	nc *nats.Conn
	c  *client.Client
}

func (e *env) json() bool { return e.output == "json" }

// client connects on first use.
func (e *env) client(ctx context.Context) (*client.Client, error) {
	if e.c != nil {
		return e.c, nil
	}
	cc, err := e.nats.Config("fleetctl", nil)
	if err != nil {
		return nil, exit(exitUsage, "%v", err)
	}
	cc.ConnectTimeout = 5 * time.Second
	nc, err := queue.Connect(ctx, cc)
	if err != nil {
		return nil, exit(exitFleet, "%v", err)
	}
	e.nc = nc
	e.c, err = client.New(nc, client.WithPrefix(e.prefix), client.WithTenant(e.tenant))
	return e.c, err
}

func (e *env) close() {
	if e.nc != nil {
		e.nc.Close()
	}
}
