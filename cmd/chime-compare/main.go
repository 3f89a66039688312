// Command chime-compare measures two builds of chimed against each other in
// the same hour: for each workload it runs chimectl bench on a fresh 3-node
// dev cluster (chimed dev --nodes 3 --shards 3) of build A, then B, then B,
// then A, for --rounds rounds, with one chimectl for both, and prints each
// figure's mean for A and B, the ratio and the spread.
//
// This machine's speed drifts by a quarter between days and by more than a
// tenth within an hour, so a figure means something only beside one taken
// at the same time; A B B A cancels a steady drift, and the spread says how
// much noise is left.
//
//	go run ./cmd/chime-compare --a 903d039 --b HEAD --rounds 3 --workloads ingest,drain
//	go run ./cmd/chime-compare --a /tmp/old/chimed --b /tmp/new/chimed --workloads precision
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chime-compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		a, b      = fs.String("a", "", "build A: a git revision (built in a temporary worktree) or the path of a chimed binary"), fs.String("b", "HEAD", "build B, as --a")
		ctl       = fs.String("chimectl", "", "the chimectl `binary` that drives both (default: built from this checkout)")
		rounds    = fs.Int("rounds", 3, "A B B A rounds per workload")
		workloads = fs.String("workloads", "ingest,drain,precision", "comma list of workloads: "+strings.Join(workloadNames(), ", "))
		scale     = fs.Float64("scale", 1, "multiply each workload's event count by this (0.1 for a quick look)")
		out       = fs.String("out", "", "`dir`ectory to keep each run's chimectl --json output in (default: a temporary one)")
	)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: chime-compare --a REV|BINARY [--b REV|BINARY] [flags]\n\n"+
			"Runs each workload on a fresh 3-node dev cluster of A, B, B, A per round, with one chimectl,\n"+
			"and prints every figure's mean for A and B, B/A and the spread (min-max). Run nothing\n"+
			"else on the machine meanwhile. The workloads:\n\n")
		for _, w := range workloadList {
			fmt.Fprintf(stderr, "  %-10s chimectl bench %s\n", w.name, strings.Join(w.args, " "))
		}
		fmt.Fprintf(stderr, "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ws, err := pickWorkloads(*workloads, *scale)
	switch {
	case *a == "":
		fmt.Fprintln(stderr, "chime-compare: --a is required: a git revision or a chimed binary")
		return 2
	case *rounds < 1:
		fmt.Fprintln(stderr, "chime-compare: --rounds must be at least 1")
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "chime-compare: --workloads: %v\n", err)
		return 2
	}
	work, err := os.MkdirTemp("", "chime-compare-")
	if err != nil {
		fmt.Fprintf(stderr, "chime-compare: %v\n", err)
		return 1
	}
	defer func() {
		if err := os.RemoveAll(work); err != nil {
			fmt.Fprintf(stderr, "chime-compare: removing the work directory: %v\n", err)
		}
	}()
	if *out == "" {
		*out = filepath.Join(work, "runs")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(stderr, "chime-compare: %v\n", err)
		return 1
	}
	bins := map[string]string{}
	for side, src := range map[string]string{"A": *a, "B": *b} {
		if bins[side], err = build(ctx, src, "chimed", filepath.Join(work, side), stderr); err != nil {
			fmt.Fprintf(stderr, "chime-compare: build %s (%s): %v\n", side, src, err)
			return 1
		}
	}
	if *ctl == "" {
		if *ctl, err = build(ctx, "", "chimectl", filepath.Join(work, "client"), stderr); err != nil {
			fmt.Fprintf(stderr, "chime-compare: build chimectl: %v\n", err)
			return 1
		}
	}
	fmt.Fprintf(stdout, "A = %s, B = %s, %d rounds, %s\n\n", *a, *b, *rounds, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	for _, w := range ws {
		res := results{}
		for r := 1; r <= *rounds; r++ {
			for i, side := range []string{"A", "B", "B", "A"} {
				tag := fmt.Sprintf("%s-%s%d-%d", w.name, side, r, i)
				figs, err := runOnce(ctx, bins[side], *ctl, w, filepath.Join(*out, tag+".json"), work)
				if err != nil {
					fmt.Fprintf(stderr, "chime-compare: %s: %v\n", tag, err)
					return 1
				}
				res.add(side, figs)
				fmt.Fprintf(stderr, "%s: %s\n", tag, w.brief(figs))
			}
		}
		res.print(stdout, w)
	}
	return 0
}

// build returns the path of binary cmd of src: src itself when it is a
// file, else built from git revision src (this checkout when empty) into
// dir.
func build(ctx context.Context, src, cmd, dir string, stderr io.Writer) (string, error) {
	if src != "" {
		if st, err := os.Stat(src); err == nil && !st.IsDir() {
			return filepath.Abs(src)
		}
	}
	bin := filepath.Join(dir, cmd)
	if src == "" {
		return bin, goBuild(ctx, ".", bin, cmd, stderr)
	}
	tree := filepath.Join(dir, "tree")
	if err := command(ctx, ".", stderr, "git", "worktree", "add", "--detach", tree, src); err != nil {
		return "", err
	}
	defer func() {
		// git has written why to stderr; a worktree left behind is for the
		// user to remove (git worktree prune), not a reason to fail the build.
		_ = command(context.Background(), ".", stderr, "git", "worktree", "remove", "--force", tree)
	}()
	return bin, goBuild(ctx, tree, bin, cmd, stderr)
}

func goBuild(ctx context.Context, tree, bin, cmd string, stderr io.Writer) error {
	return command(ctx, tree, stderr, "go", "build", "-o", bin, "./cmd/"+cmd)
}

func command(ctx context.Context, dir string, stderr io.Writer, name string, args ...string) error {
	c := exec.CommandContext(ctx, name, args...)
	c.Dir, c.Stdout, c.Stderr = dir, stderr, stderr
	return c.Run()
}

// runOnce starts a fresh dev cluster of chimed, waits until it answers,
// runs w against it with ctl, keeps the JSON in keep, stops the cluster,
// and returns the figures.
func runOnce(ctx context.Context, chimed, ctl string, w workload, keep, work string) (map[string]float64, error) {
	data, err := os.MkdirTemp(work, "cluster-")
	if err != nil {
		return nil, err
	}
	// The cluster's data goes with this run: one left behind by a failed
	// removal is reclaimed with work, which holds it.
	defer func() { _ = os.RemoveAll(data) }()
	log, err := os.Create(filepath.Join(data, "chimed.log"))
	if err != nil {
		return nil, err
	}
	// chimed writes the log; it is read only by a user told its name in an
	// error, and is removed with data just after.
	defer func() { _ = log.Close() }()
	node := exec.Command(chimed, "dev", "--nodes", "3", "--shards", "3", "--data-dir", filepath.Join(data, "d"))
	node.Stdout, node.Stderr = log, log
	if err := node.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- node.Wait() }()
	defer stopNode(node, exited)

	deadline := time.Now().Add(60 * time.Second)
	for exec.CommandContext(ctx, ctl, "--addr", devAddr, "--timeout", "2s", "status").Run() != nil {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("chimed dev exited while starting (%v); its log: %s", err, log.Name())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(300 * time.Millisecond): // polls for the cluster; the deadline bounds it
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("chimed dev did not answer within 60 s; its log: %s", log.Name())
		}
	}
	// Every shard's voters and leader settle on their placement a few seconds
	// after the cluster answers (longer on a loaded machine): a run started
	// before would measure the moves. A build whose status names no placement
	// is given 3 s.
	for settled := time.Now().Add(60 * time.Second); ; {
		done, known := placed(ctx, ctl)
		if done || (!known && time.Until(settled) < 57*time.Second) {
			break
		}
		if time.Now().After(settled) {
			return nil, fmt.Errorf("chimed dev's shards did not settle on their placement within 60 s; its log: %s", log.Name())
		}
		select {
		case <-time.After(200 * time.Millisecond): // polls the status; the deadline bounds it
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	bench := exec.CommandContext(ctx, ctl, append([]string{"--addr", devAddr, "--json", "bench"}, w.args...)...)
	var errOut strings.Builder
	bench.Stderr = &errOut
	b, err := bench.Output()
	if err != nil {
		return nil, fmt.Errorf("chimectl bench %s: %v: %s", strings.Join(w.args, " "), err, tail(errOut.String(), 2000))
	}
	if err := os.WriteFile(keep, b, 0o644); err != nil {
		return nil, err
	}
	return figures(b)
}

// placed reports whether every shard of the dev cluster has exactly its
// desired voters, no non-voter, and its preferred node (the first desired)
// as leader; known is false when the status names no desired voters (a
// build from before the status carried them) or could not be read.
func placed(ctx context.Context, ctl string) (done, known bool) {
	out, err := exec.CommandContext(ctx, ctl, "--addr", devAddr, "--timeout", "2s", "--json", "status").Output()
	if err != nil {
		return false, false
	}
	var st struct {
		Shards []struct {
			Leader    string   `json:"leader"`
			Voters    []string `json:"voters"`
			Nonvoters []string `json:"nonvoters"`
			Desired   []string `json:"desired"`
		} `json:"shards"`
	}
	if json.Unmarshal(out, &st) != nil || len(st.Shards) == 0 {
		return false, false
	}
	for _, sh := range st.Shards {
		if len(sh.Desired) == 0 {
			return false, false
		}
		voters, desired := slices.Clone(sh.Voters), slices.Clone(sh.Desired)
		slices.Sort(voters)
		slices.Sort(desired)
		if sh.Leader != sh.Desired[0] || len(sh.Nonvoters) > 0 || !slices.Equal(voters, desired) {
			return false, true
		}
	}
	return true, true
}

// devAddr is where chimed dev's first node serves gRPC.
const devAddr = "127.0.0.1:7070"

func stopNode(node *exec.Cmd, exited <-chan error) {
	// Signal and Kill fail only for a process that has exited, which exited
	// then reports; what it exited with does not matter once the run's
	// figures are in.
	_ = node.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = node.Process.Kill()
		<-exited
	}
}

// figures are the numbers of a chimectl bench --json summary.
func figures(b []byte) (map[string]float64, error) {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("chimectl bench --json output: %w", err)
	}
	out := map[string]float64{}
	for k, v := range raw {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	if len(out) == 0 {
		return nil, errors.New("chimectl bench --json output holds no figures")
	}
	return out, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
