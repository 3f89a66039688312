package deploy

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
)

// use is one flag, variable or subcommand a deploy file passes to chimed or
// chimectl, and where.
type use struct {
	where string
	tool  string // chimed or chimectl
	kind  string // flag, env or subcommand
	name  string // flag name without dashes, variable name, subcommand
}

// cli is what the binaries accept, read from their help.
type cli struct {
	serveFlags    map[string]bool // chimed serve --help
	subcommands   map[string]bool // chimed --help
	chimectlFlags map[string]bool // chimectl help drain: drain's and the global flags
}

// nonFlagEnv are the CHIME_* variables that name no flag and are read as
// they are: the SASL password (chimed: it has no flag so it stays out of ps),
// and chimectl's address and token.
var nonFlagEnv = map[string]bool{"CHIME_KAFKA_SASL_PASSWORD": true, "CHIME_ADDR": true, "CHIME_TOKEN": true}

// envFlag is the flag a CHIME_* variable stands for: CHIME_KAFKA_BROKERS
// is --kafka-brokers.
func envFlag(name string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "CHIME_")), "_", "-")
}

// unknownUses returns every use the binaries do not accept.
func unknownUses(uses []use, c cli) []string {
	var bad []string
	for _, u := range uses {
		ok := false
		switch {
		case u.kind == "subcommand":
			ok = c.subcommands[u.name]
		case u.kind == "env" && nonFlagEnv[u.name]:
			ok = true
		case u.kind == "env":
			ok = c.serveFlags[envFlag(u.name)]
		case u.tool == "chimed":
			ok = c.serveFlags[u.name]
		case u.tool == "chimectl":
			ok = c.chimectlFlags[u.name]
		}
		if !ok {
			what := u.name
			switch u.kind {
			case "flag":
				what = "--" + u.name
			case "env":
				what = fmt.Sprintf("%s (--%s)", u.name, envFlag(u.name))
			}
			bad = append(bad, fmt.Sprintf("%s: %s %s %s", u.where, u.tool, u.kind, what))
		}
	}
	sort.Strings(bad)
	return bad
}

var (
	goFlagLine  = regexp.MustCompile(`(?m)^\s+-([a-z0-9][a-z0-9-]*)`)
	dashFlag    = regexp.MustCompile(`(?m)^\s+--([a-z0-9][a-z0-9-]*)`)
	commandLine = regexp.MustCompile(`(?m)^\s+chimed ([a-z]+)\b`)
)

// binaryCLI runs the built binaries' help and reads their flags and
// subcommands.
func binaryCLI(t *testing.T) cli {
	t.Helper()
	chimed, chimectl := builtBinaries(t)
	help := func(bin string, args ...string) string {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	set := func(re *regexp.Regexp, text string) map[string]bool {
		m := map[string]bool{}
		for _, s := range re.FindAllStringSubmatch(text, -1) {
			m[s[1]] = true
		}
		return m
	}
	c := cli{
		serveFlags:    set(goFlagLine, help(chimed, "serve", "--help")),
		subcommands:   set(commandLine, help(chimed, "--help")),
		chimectlFlags: set(dashFlag, help(chimectl, "help", "drain")),
	}
	// Help that printed nothing the patterns find would make every check
	// fail; help that changed format so that they find too little, likewise.
	for what, n := range map[string]int{"chimed serve flags": len(c.serveFlags), "chimed subcommands": len(c.subcommands), "chimectl drain flags": len(c.chimectlFlags)} {
		if n < 3 {
			t.Fatalf("read only %d %s from the help", n, what)
		}
	}
	for _, f := range []string{"kafka-brokers", "node-id", "tls-cert"} {
		if !c.serveFlags[f] {
			t.Fatalf("chimed serve --help, as read, lacks --%s", f)
		}
	}
	if !c.subcommands["serve"] || !c.chimectlFlags["timeout-drain"] || !c.chimectlFlags["addr"] {
		t.Fatalf("the help as read lacks serve, drain's --timeout-drain or the global --addr: %v %v", c.subcommands, c.chimectlFlags)
	}
	return c
}

// flagsIn returns the flags (without dashes, without =value) of a command
// line's words.
func flagsIn(words []string) []string {
	var flags []string
	for _, w := range words {
		if strings.HasPrefix(w, "-") && w != "-" && w != "--" {
			name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
			flags = append(flags, name)
		}
	}
	return flags
}

func flagUses(where, tool string, words []string) []use {
	var uses []use
	for _, f := range flagsIn(words) {
		uses = append(uses, use{where, tool, "flag", f})
	}
	return uses
}

func envUses(where string, names []string) []use {
	var uses []use
	for _, n := range names {
		if strings.HasPrefix(n, "CHIME_") {
			uses = append(uses, use{where, "chimed", "env", n})
		}
	}
	return uses
}

// deployUses collects what every deploy file passes to chimed and chimectl.
func deployUses(t *testing.T) []use {
	t.Helper()
	var uses []use

	// The chart, rendered with each value set: the container's arguments
	// and environment, and the preStop hook.
	for _, set := range valueSets {
		m := renderSet(t, set)
		for _, sts := range m.statefulSets {
			for _, c := range sts.Spec.Template.Spec.Containers {
				where := fmt.Sprintf("chart (%s values), container %s", set, c.Name)
				if len(c.Args) == 0 || c.Args[0] != "serve" {
					t.Errorf("%s: args %q do not start with serve", where, c.Args)
					continue
				}
				uses = append(uses, use{where, "chimed", "subcommand", "serve"})
				uses = append(uses, flagUses(where+" args", "chimed", c.Args[1:])...)
				var names []string
				for _, e := range c.Env {
					names = append(names, e.Name)
				}
				uses = append(uses, envUses(where+" env", names)...)
				if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil {
					uses = append(uses, flagUses(where+" preStop", "chimectl", c.Lifecycle.PreStop.Exec.Command)...)
				}
			}
		}
	}

	// The Dockerfile: its variables, its CMD (the subcommand) and its
	// health check.
	ins := parseDockerfile(string(readFile(t, dockerfilePath)))
	var names []string
	for k := range dockerEnv(ins) {
		names = append(names, k)
	}
	uses = append(uses, envUses("Dockerfile ENV", names)...)
	for _, in := range ins {
		if in.cmd != "CMD" && in.cmd != "HEALTHCHECK" {
			continue
		}
		list, err := execForm(in.args)
		if err != nil {
			t.Fatalf("Dockerfile %s: %v", in.cmd, err)
		}
		if in.cmd == "HEALTHCHECK" {
			list = list[1:] // the chimed binary
		}
		uses = append(uses, use{"Dockerfile " + in.cmd, "chimed", "subcommand", list[0]})
		uses = append(uses, flagUses("Dockerfile "+in.cmd, "chimed", list[1:])...)
	}

	// The compose file: every service's CHIME_* variables, and the
	// health check's subcommand.
	p, err := loadCompose(composeDir, readFile(t, filepath.Join(composeDir, "compose.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		var names []string
		for k := range s.Environment {
			names = append(names, k)
		}
		uses = append(uses, envUses("compose "+name+" environment", names)...)
		if s.HealthCheck != nil && len(s.HealthCheck.Test) > 2 && s.HealthCheck.Test[1] == "/usr/local/bin/chimed" {
			uses = append(uses, use{"compose " + name + " healthcheck", "chimed", "subcommand", s.HealthCheck.Test[2]})
		}
		uses = append(uses, composeCommandUses(name, s)...)
	}

	// The systemd unit and its environment file. ExecStop's $CHIMECTL_FLAGS
	// expands to the file's CHIMECTL_FLAGS words.
	u, err := parseUnit(string(readFile(t, unitPath)))
	if err != nil {
		t.Fatal(err)
	}
	set, commented := envFile(string(readFile(t, envFilePath)))
	for _, line := range u["Service"]["ExecStart"] {
		words := strings.Fields(strings.TrimLeft(line, "-@:+!"))
		if len(words) < 2 || words[0] != "/usr/local/bin/chimed" {
			t.Fatalf("ExecStart %q does not run /usr/local/bin/chimed SUBCOMMAND", line)
		}
		uses = append(uses, use{"chimed.service ExecStart", "chimed", "subcommand", words[1]})
		uses = append(uses, flagUses("chimed.service ExecStart", "chimed", words[2:])...)
	}
	for _, line := range u["Service"]["ExecStop"] {
		words := strings.Fields(strings.ReplaceAll(strings.TrimLeft(line, "-@:+!"), "$CHIMECTL_FLAGS", set["CHIMECTL_FLAGS"]))
		uses = append(uses, flagUses("chimed.service ExecStop", "chimectl", words)...)
	}
	var envNames []string
	for k := range set {
		envNames = append(envNames, k)
	}
	for k := range commented {
		envNames = append(envNames, k)
	}
	uses = append(uses, envUses("chimed.env", envNames)...)
	return uses
}

// composeCommandUses returns the subcommand and flags a compose service
// passes to chimed with command:, if it runs the Chime image.
func composeCommandUses(name string, s types.ServiceConfig) []use {
	if s.Image != "chime:dev" || len(s.Command) == 0 {
		return nil
	}
	where := "compose " + name + " command"
	return append([]use{{where, "chimed", "subcommand", s.Command[0]}}, flagUses(where, "chimed", s.Command[1:])...)
}

// TestDeployFlagsExist: every flag, CHIME_* variable and subcommand the
// deploy files pass is one chimed or chimectl accepts, as their help says.
func TestDeployFlagsExist(t *testing.T) {
	c := binaryCLI(t)
	uses := deployUses(t)
	// Each kind of file must have been read; a parser that silently found
	// nothing would pass any file.
	count := map[string]int{}
	for _, u := range uses {
		count[strings.Fields(u.where)[0]+" "+u.kind]++
	}
	for _, want := range []string{"chart flag", "chart env", "Dockerfile env", "Dockerfile subcommand", "compose env",
		"compose subcommand", "chimed.service flag", "chimed.service subcommand", "chimed.env env"} {
		if count[want] == 0 {
			t.Errorf("found no %s use; the collection is broken", want)
		}
	}
	for _, bad := range unknownUses(uses, c) {
		t.Error("not accepted: " + bad)
	}
}

func TestUnknownUsesIsStrict(t *testing.T) {
	c := cli{
		serveFlags:    map[string]bool{"kafka-brokers": true, "node-id": true, "insecure": true},
		subcommands:   map[string]bool{"serve": true, "dev": true},
		chimectlFlags: map[string]bool{"addr": true, "timeout-drain": true},
	}
	good := []use{
		{"a", "chimed", "flag", "kafka-brokers"},
		{"a", "chimed", "env", "CHIME_NODE_ID"},
		{"a", "chimed", "env", "CHIME_INSECURE"},
		{"a", "chimed", "env", "CHIME_KAFKA_SASL_PASSWORD"},
		{"a", "chimed", "env", "CHIME_ADDR"},
		{"a", "chimed", "subcommand", "serve"},
		{"a", "chimectl", "flag", "timeout-drain"},
	}
	if bad := unknownUses(good, c); len(bad) > 0 {
		t.Errorf("refused known uses: %v", bad)
	}
	for _, u := range []use{
		{"b", "chimed", "flag", "kafka-broker"},
		{"b", "chimed", "env", "CHIME_NODEID"},
		{"b", "chimed", "env", "CHIME_TIMEOUT_DRAIN"},
		{"b", "chimed", "subcommand", "health"},
		{"b", "chimectl", "flag", "node-id"},
		{"b", "chimed", "flag", "timeout-drain"},
	} {
		if bad := unknownUses([]use{u}, c); len(bad) != 1 {
			t.Errorf("accepted %+v", u)
		}
	}
	if got := flagsIn([]string{"serve", "--node-id=$(POD_NAME)", "-insecure", "--join", "a:1", "--"}); strings.Join(got, " ") != "node-id insecure join" {
		t.Errorf("flagsIn = %v", got)
	}
}
