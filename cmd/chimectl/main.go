// Command chimectl is the command-line client for Chime: it schedules,
// cancels and inspects events over the chime.v1 gRPC API, tails a Kafka
// topic to watch them arrive, and operates the cluster (status, drain,
// transfer-leader, remove, backup) over chime.v1.Admin. Run `chimectl --help` for
// its usage.
//
// Exit status: 0 on success, 1 when a request fails (the gRPC code and
// message are printed as "chimectl: <code>: <message>"), 2 for a usage
// error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/status"
)

const (
	defaultAddr = "127.0.0.1:7070"
	addrEnv     = "CHIME_ADDR"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &cli{
		stdin:  os.Stdin,
		stdout: os.Stdout,
		stderr: os.Stderr,
		getenv: os.Getenv,
		now:    time.Now,
		loc:    time.Local,
	}
	os.Exit(c.run(ctx, os.Args[1:]))
}

// cli is one invocation of chimectl, with everything it touches injected so
// that tests can run it in-process.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time
	loc            *time.Location // for human-readable times
	// sleep waits d or until ctx is done (drain --wait between calls); nil
	// means real time. Tests pair it with now to run on a fake clock.
	sleep func(ctx context.Context, d time.Duration) error

	// Global flags.
	addr    string
	timeout time.Duration
	json    bool
	tls     tlsFlags
}

// command is a subcommand: its help text, its flags, and what it does with
// the arguments left after the flags.
type command struct {
	name    string
	summary string // one line, for the command list
	args    string // positional arguments, for the usage line
	about   string // one paragraph
	example string // indented examples, one per line
	flags   func(c *cli, fs *flag.FlagSet) func(ctx context.Context, args []string) error
}

func commands() []*command {
	return []*command{
		scheduleCommand(), updateCommand(), cancelCommand(), getCommand(), listCommand(), countCommand(), forecastCommand(), recurringCommand(), tailCommand(), benchCommand(),
		statusCommand(), drainCommand(), transferLeaderCommand(), removeCommand(), clusterMapCommand(), rateLimitCommand(), backupCommand(),
	}
}

// usageError is bad command-line input: printed with a hint, exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

const topAbout = `chimectl talks to a Chime cluster, the durable delayed-event scheduler: it
schedules a record to be produced to a Kafka topic at a given time, cancels
it, shows an event and its state, manages recurring schedules, and tails a
topic to watch records arrive and how late they were. For operators it shows the cluster's members and
shards, drains a node before it is stopped, moves a shard's leadership,
removes a node that will not come back, and backs the whole cluster up for
chimed restore. Any Chime node accepts any request.
Requests are gRPC (chime.v1.Scheduler, chime.v1.Recurring and chime.v1.Admin);
tail reads Kafka directly.`

const topExamples = `  chimectl schedule --topic reminders --in 30m --key user-7 --payload '{"remind":true}'
  CHIME_ADDR=chime-1:7070 chimectl get --json order-42-reminder
  chimectl tail --topic reminders --brokers kafka-0:9092,kafka-1:9092
  chimectl status
  chimectl drain node-2 && ssh node-2 systemctl stop chimed`

// run executes chimectl with args (without the program name) and returns
// the exit status.
func (c *cli) run(ctx context.Context, args []string) int {
	gfs := c.globalFlags("chimectl")
	if err := gfs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.topUsage(c.stdout)
			return 0
		}
		fmt.Fprintf(c.stderr, "chimectl: %v\n\n", err)
		c.topUsage(c.stderr)
		return 2
	}
	rest := gfs.Args()
	if len(rest) == 0 {
		fmt.Fprintf(c.stderr, "chimectl: no command given\n\n")
		c.topUsage(c.stderr)
		return 2
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		if len(rest) == 0 {
			c.topUsage(c.stdout)
			return 0
		}
		if cmd := findCommand(rest[0]); cmd != nil {
			c.commandUsage(c.stdout, cmd)
			return 0
		}
		name = rest[0]
	}
	cmd := findCommand(name)
	if cmd == nil {
		fmt.Fprintf(c.stderr, "chimectl: unknown command %q\n\n", name)
		c.topUsage(c.stderr)
		return 2
	}

	fs := c.globalFlags(cmd.name)
	action := cmd.flags(c, fs)
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.commandUsage(c.stdout, cmd)
			return 0
		}
		// The flag package names flags with one dash; this help uses two.
		msg := strings.NewReplacer("flag -", "flag --", "defined: -", "defined: --").Replace(err.Error())
		if n, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			if _, numErr := strconv.ParseFloat(n, 64); numErr == nil {
				msg = fmt.Sprintf("-%s is taken for a flag; to pass a negative number as an argument, put it after --", n)
			}
		}
		fmt.Fprintf(c.stderr, "chimectl %s: %s\nRun 'chimectl %s --help' for usage.\n", cmd.name, msg, cmd.name)
		return 2
	}
	err = action(ctx, pos)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "chimectl %s: %v\nRun 'chimectl %s --help' for usage.\n", cmd.name, ue.msg, cmd.name)
		return 2
	default:
		if st, ok := status.FromError(err); ok {
			fmt.Fprintf(c.stderr, "chimectl: %v: %s\n", st.Code(), st.Message())
		} else {
			fmt.Fprintf(c.stderr, "chimectl: %v\n", err)
		}
		return 1
	}
}

func findCommand(name string) *command {
	for _, cmd := range commands() {
		if cmd.name == name {
			return cmd
		}
	}
	return nil
}

// globalFlags returns a FlagSet with the global flags bound to c. Every
// command's FlagSet starts from it, so the global flags work before and
// after the command name; each parse starts from the values already set.
func (c *cli) globalFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints errors and usage itself
	if c.addr == "" {
		c.addr = defaultAddr
		if v := c.getenv(addrEnv); v != "" {
			c.addr = v
		}
		c.timeout = 10 * time.Second
		c.tls.envToken = c.getenv(tokenEnv) // not the flag's default, which --help prints
	}
	fs.StringVar(&c.addr, "addr", c.addr, "gRPC `address` (host:port) of any Chime node; env "+addrEnv+" overrides the default")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "deadline for each request to Chime (not for tail)")
	fs.BoolVar(&c.json, "json", c.json, "print JSON instead of text (one object per record for tail)")
	c.tls.register(fs)
	return fs
}

var globalFlagNames = map[string]bool{"addr": true, "timeout": true, "json": true,
	"tls": true, "tls-ca": true, "tls-cert": true, "tls-key": true, "tls-server-name": true, "token": true}

// parseInterleaved parses flags that may come before, between or after the
// positional arguments (`get ID --json`), which the flag package alone stops
// at. Everything after "--" is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func (c *cli) topUsage(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nUsage:\n  chimectl [global flags] <command> [flags] [arguments]\n\nCommands:\n", topAbout)
	width := len("help")
	for _, cmd := range commands() {
		width = max(width, len(cmd.name))
	}
	for _, cmd := range commands() {
		fmt.Fprintf(w, "  %-*s  %s\n", width, cmd.name, cmd.summary)
	}
	fmt.Fprintf(w, "  %-*s  %s\n", width, "help", "show the help of a command: chimectl help <command>")
	fmt.Fprintf(w, "\nGlobal flags (before or after the command):\n")
	c.printFlags(w, c.defaultGlobalFlags(), func(string) bool { return true })
	fmt.Fprintf(w, "\nExamples:\n%s\n\nRun 'chimectl <command> --help' for a command's flags and examples.\n", topExamples)
}

func (c *cli) commandUsage(w io.Writer, cmd *command) {
	fmt.Fprintf(w, "chimectl %s - %s\n\n%s\n\nUsage:\n  chimectl %s [flags]", cmd.name, cmd.summary, cmd.about, cmd.name)
	if cmd.args != "" {
		fmt.Fprintf(w, " %s", cmd.args)
	}
	fmt.Fprintf(w, "\n\nFlags:\n")
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cmd.flags(&cli{}, fs)
	own := 0
	fs.VisitAll(func(f *flag.Flag) {
		if !globalFlagNames[f.Name] {
			own++
		}
	})
	if own == 0 {
		fmt.Fprintf(w, "  (none besides the global flags)\n")
	}
	c.printFlags(w, fs, func(name string) bool { return !globalFlagNames[name] })
	fmt.Fprintf(w, "\nGlobal flags:\n")
	c.printFlags(w, c.defaultGlobalFlags(), func(string) bool { return true })
	fmt.Fprintf(w, "\nExamples:\n%s\n", cmd.example)
}

// defaultGlobalFlags is the global FlagSet with the defaults a fresh
// invocation would have, for help output.
func (c *cli) defaultGlobalFlags() *flag.FlagSet {
	fresh := &cli{getenv: c.getenv}
	return fresh.globalFlags("chimectl")
}

// printFlags prints the flags of fs that keep selects, with two dashes,
// their type, usage and default.
func (c *cli) printFlags(w io.Writer, fs *flag.FlagSet, keep func(string) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if !keep(f.Name) {
			return
		}
		typ, usage := flag.UnquoteUsage(f)
		usage = strings.ReplaceAll(usage, "\n", "\n      ") // a usage of several lines stays indented
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintf(w, "%s\n      %s", line, usage)
		def := f.DefValue
		if g, ok := f.Value.(flag.Getter); ok {
			if d, ok := g.Get().(time.Duration); ok {
				def = humanDuration(d) // 5m, not 5m0s
			}
		}
		switch def {
		case "", "false", "0", "0s", "[]":
		default:
			fmt.Fprintf(w, " (default %s)", def)
		}
		fmt.Fprintln(w)
	})
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }

func (m *multiFlag) Set(v string) error {
	*m = append(*m, v)
	return nil
}
