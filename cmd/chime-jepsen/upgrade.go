package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// defaultOldCommit is the build the upgrade nemesis starts the cluster on: the last commit
// that changed what a node writes to its Raft log, its Pebble or a snapshot stream
// ("Recurring Trigger and Backfill; Scheduler Forecast from per-minute due counts"). It
// added the Recurring command's Trigger and Backfill ops (6 and 7), which a build before it
// cannot decode. Every later commit reads and writes the same Raft entries, key layout 4,
// body formats 1-4 and snapshot format 3, so a cluster mixing it with the current build
// must agree on everything; a downgrade to it is one "within a format that both read". It
// serves every flag the driver passes (all but --console, which the driver does not pass)
// and every RPC the workload calls (the workload filters nothing by priority, the one
// field added since).
const defaultOldCommit = "46e202a3898693484c2d780289963ff8b6365e49"

// Build labels: the old build a run with the upgrade nemesis starts on, and the current one.
const (
	buildOld = "old"
	buildNew = "new"
)

// chimedBuild is one chimed binary a node can run.
type chimedBuild struct {
	label string // buildOld or buildNew
	bin   string
	// unknown are the serve flags the driver passes that this build does not list in its
	// serve --help (nil: it knows every one); arity says, for each flag of the current
	// build, whether it takes a value.
	unknown map[string]bool
	arity   map[string]bool
}

// args drops from args the flags b does not know, with their values: an older chimed
// refuses a flag it does not know, and the run is better off with the old build running
// without a feature than with no old build at all.
func (b *chimedBuild) args(args []string) []string {
	if len(b.unknown) == 0 {
		return args
	}
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		name, _, inline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if strings.HasPrefix(args[i], "-") && b.unknown[name] {
			if b.arity[name] && !inline {
				i++ // its value goes with it
			}
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// serveFlags runs `bin serve --help` and returns each flag it lists, true for those that
// take a value (Go's flag package prints "  -name type" for them, "  -name" for a boolean).
func serveFlags(bin string) (map[string]bool, error) {
	// --help makes chimed print its usage and exit non-zero; the usage is the answer.
	out, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	flags := parseFlagUsage(strings.NewReader(string(out)))
	if len(flags) == 0 {
		return nil, fmt.Errorf("%s serve --help listed no flags:\n%s", bin, out)
	}
	return flags, nil
}

// parseFlagUsage reads the flags of a Go flag package usage text.
func parseFlagUsage(r io.Reader) map[string]bool {
	flags := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "  -") || strings.HasPrefix(l, "  --") {
			continue
		}
		f := strings.Fields(l)
		flags[strings.TrimPrefix(f[0], "-")] = len(f) > 1
	}
	return flags
}

// unknownFlags are the flags of the current build's serve that old does not list.
func unknownFlags(current, old map[string]bool) map[string]bool {
	out := map[string]bool{}
	for f := range current {
		if _, ok := old[f]; !ok {
			out[f] = true
		}
	}
	return out
}

// buildOldChimed builds chimed, with the chimefault tag the skew nemesis needs, from commit
// of the repository the driver runs in, into dir/chimed-old. The source is unpacked with
// git archive into a folder of dir (no worktree is registered in the repository, which
// other checkouts share) and removed once built.
func buildOldChimed(dir, commit string) (string, error) {
	if out, err := exec.Command("git", "rev-parse", "--verify", "--quiet", commit+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("--old-commit %s: no such commit in this repository (%v) %s", commit, err, out)
	}
	src := filepath.Join(dir, "old-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	defer func() {
		// A build tree, of no use after the build; one left behind stays in --out.
		_ = os.RemoveAll(src)
	}()
	archive := exec.Command("git", "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", err
	}
	untar.Stdin = pipe
	var archiveErr, untarErr strings.Builder
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return "", err
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait() // archive's error is the cause
		return "", fmt.Errorf("git archive %s: %v %s", commit, err, archiveErr.String())
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("unpacking %s: %v %s", commit, err, untarErr.String())
	}
	if _, err := os.Stat(filepath.Join(src, "cmd", "chimed", "clock_fault.go")); err != nil {
		return "", fmt.Errorf("--old-commit %s has no chimefault clock (cmd/chimed/clock_fault.go), which the skew nemesis needs: choose a later commit", commit)
	}
	bin := filepath.Join(dir, "chimed-old")
	build := exec.Command("go", "build", "-tags", "chimefault", "-o", bin, "./cmd/chimed")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building chimed at %s: %v\n%s", commit, err, out)
	}
	return bin, nil
}

// newBuilds returns the current build and the old one, the old one's unknown flags found
// from both builds' serve --help.
func newBuilds(current, old string) (cur, prev *chimedBuild, err error) {
	curFlags, err := serveFlags(current)
	if err != nil {
		return nil, nil, err
	}
	oldFlags, err := serveFlags(old)
	if err != nil {
		return nil, nil, err
	}
	cur = &chimedBuild{label: buildNew, bin: current}
	prev = &chimedBuild{label: buildOld, bin: old, unknown: unknownFlags(curFlags, oldFlags), arity: curFlags}
	return cur, prev, nil
}

// droppedFlags names the flags of args that b drops, for the log.
func (b *chimedBuild) droppedFlags(args []string) []string {
	var out []string
	for _, a := range args {
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && b.unknown[name] {
			out = append(out, "--"+name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
