package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"syscall"
	"time"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
)

// The nemesis breaks things on a schedule: a healthy start, then one fault
// about every 10 s, held 5-20 s, healed, and a final heal at the end. Each
// fault is recorded in the history as a window [start, heal].

// faultKinds are the nemeses --nemesis can name; "mixed" draws from all but upgrade, which
// it draws only when --old-commit or --old-binary is given (nemesisKinds).
var faultKinds = []string{"kill", "kill-minority", "kill-leader", "kill-all", "pause", "pause-leader",
	"partition-one", "partition-halves", "partition-bridge", "partition-leader", "loss", "slow", "skew", "kafka-cut",
	"membership", "upgrade", "disk-full", "disk-stall"}

type nemesis struct {
	c *cluster
	// size is the number of members the run starts with, which the
	// membership nemesis keeps it within one of.
	size   int
	h      *history
	kinds  []string
	r      *rand.Rand
	logger *slog.Logger

	// The upgrade nemesis's builds (nil without it) and its direction: it moves one node
	// at a time from old to current until none runs old, then back until none runs
	// current, and so on, so that the cluster is mixed most of the time and every node
	// meets data the other build wrote.
	current, old *chimedBuild
	downgrading  bool
}

// stopGrace is how long an upgrade's graceful stop waits before it kills: chimed's own
// --shutdown-timeout (30 s) and a margin.
const stopGrace = 40 * time.Second

// fault is an applied fault and how to heal it.
type fault struct {
	op   checker.Op
	heal func()
	// hold is how long the fault lasts; 0 draws the usual 5-20 s.
	hold time.Duration
}

func (nm *nemesis) run(ctx context.Context, healthyStart time.Duration) {
	if len(nm.kinds) == 0 {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(healthyStart):
	}
	var deck []string
	first := true
	for ctx.Err() == nil {
		if len(deck) == 0 {
			deck = nm.deal(first)
			first = false
		}
		kind := deck[0]
		deck = deck[1:]
		f, err := nm.apply(ctx, kind)
		if err != nil {
			nm.logger.Warn("nemesis", "kind", kind, "err", err)
		}
		hold := 5*time.Second + time.Duration(nm.r.Int64N(int64(15*time.Second)))
		if f != nil && f.hold > 0 {
			hold = f.hold
		}
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
		if f != nil {
			f.heal()
			f.op.CompleteNs = time.Now().UnixNano()
			f.op.Type = "ok"
			nm.h.add(f.op)
			nm.logger.Info("healed", "kind", kind, "targets", f.op.Targets)
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

// deal shuffles the kinds for the next round: every kind is drawn once
// before any is drawn again, so a 10-minute mixed run meets each about
// twice. In the first round a membership change comes first, so that even a
// short run (CI's) changes the membership under load.
func (nm *nemesis) deal(first bool) []string {
	deck := slices.Clone(nm.kinds)
	nm.r.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
	if i := slices.Index(deck, "membership"); first && i > 0 {
		deck[0], deck[i] = deck[i], deck[0]
	}
	return deck
}

// pick returns k distinct random active nodes.
func (nm *nemesis) pick(k int) []*node {
	ns := nm.c.active()
	nm.r.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
	return ns[:k]
}

func (nm *nemesis) apply(ctx context.Context, kind string) (*fault, error) {
	c := nm.c
	op := checker.Op{F: "nemesis", Kind: kind, InvokeNs: time.Now().UnixNano()}
	nodes := c.active()
	minority := len(nodes) / 2
	var targets []*node
	var heal func()
	var hold time.Duration
	var err error
	switch kind {
	case "kill", "kill-minority", "kill-leader", "kill-all":
		switch kind {
		case "kill":
			targets = nm.pick(1)
		case "kill-minority":
			targets = nm.pick(minority)
		case "kill-leader":
			targets = []*node{c.leaderOfMost(ctx)}
		default:
			targets = nodes
		}
		for _, n := range targets {
			n.kill()
		}
		heal = func() {
			for _, n := range targets {
				if err := n.start(); err != nil {
					nm.logger.Error("restarting", "node", n.id, "err", err)
				}
			}
		}
	case "pause", "pause-leader":
		targets = nm.pick(1)
		if kind == "pause-leader" {
			targets = []*node{c.leaderOfMost(ctx)}
		}
		for _, n := range targets {
			n.signal(syscall.SIGSTOP)
		}
		heal = func() {
			for _, n := range targets {
				n.signal(syscall.SIGCONT)
			}
		}
	case "partition-one", "partition-leader", "partition-halves", "partition-bridge":
		var groups [][]*node
		switch kind {
		case "partition-one":
			targets = nm.pick(1)
		case "partition-leader":
			targets = []*node{c.leaderOfMost(ctx)}
		case "partition-halves":
			targets = nm.pick(minority)
		}
		if kind == "partition-bridge" {
			// Two halves that only the bridge node can reach both of.
			ns := nm.pick(len(nodes))
			bridgeNode := ns[0]
			a, b := ns[1:1+len(ns[1:])/2], ns[1+len(ns[1:])/2:]
			groups = [][]*node{a, b}
			targets = []*node{bridgeNode}
			op.Targets = []string{"bridge:" + bridgeNode.id, "a:" + joinIDs(a), "b:" + joinIDs(b)}
		} else {
			rest := []*node{}
			for _, n := range nodes {
				if !slices.Contains(targets, n) {
					rest = append(rest, n)
				}
			}
			groups = [][]*node{targets, rest}
		}
		err = partition(groups[0], groups[1])
		heal = nm.healAll
	case "loss":
		targets = nm.pick(1 + nm.r.IntN(len(nodes)))
		for _, n := range targets {
			if err = lose(n.i, 0.3, otherIPs(nodes, n)...); err != nil {
				break
			}
		}
		heal = nm.healAll
	case "slow":
		targets = nm.pick(1 + nm.r.IntN(2))
		for _, n := range targets {
			if err = slow(n.i); err != nil {
				break
			}
		}
		heal = nm.healAll
	case "skew":
		targets = nm.pick(1)
		skew := time.Duration(200+nm.r.IntN(4800)) * time.Millisecond
		if nm.r.IntN(2) == 0 {
			skew = -skew
		}
		op.SkewNs = int64(skew)
		for _, n := range targets {
			if err = n.setClockOffset(skew); err != nil {
				break
			}
		}
		heal = func() {
			for _, n := range targets {
				if err := n.setClockOffset(0); err != nil {
					nm.logger.Error("healing clock skew", "node", n.id, "err", err)
				}
			}
		}
	case "kafka-cut":
		targets = []*node{c.leaderOfMost(ctx)}
		err = cutKafka(targets[0].i, kafkaPort)
		heal = nm.healAll
	case "membership":
		// The change stays; the heal only closes its window.
		op.Targets, err = nm.membershipChange(ctx, nm.size)
		if op.Targets == nil {
			return nil, err
		}
		heal = func() {}
	case "upgrade":
		n, to := nm.nextUpgrade()
		targets = []*node{n}
		op.Targets = []string{n.id + ":" + to.label}
		// Two in three stop as an operator would (SIGTERM, a graceful shutdown); the
		// rest are killed, as a node that crashes just before its upgrade is.
		how := "SIGTERM"
		if nm.r.IntN(3) == 0 {
			how = "SIGKILL"
			n.kill()
		} else if exit := n.stop(stopGrace); exit != "" && exit != "exit status 0" {
			nm.logger.Warn("a graceful stop ended otherwise than with exit status 0", "node", n.id, "exit", exit)
		}
		n.setBuild(to)
		err = n.start()
		nm.logger.Info("upgrade", "node", n.id, "stop", how, "build", to.label, "bin", to.bin)
		// The node stays on its new build: the next upgrade moves another one.
		heal = func() {}
	case "disk-full", "disk-stall":
		// The leader of the most shards: a follower whose disk fails only falls behind,
		// while a leader must hand its shards over rather than hold them while it can
		// persist nothing.
		n := c.leaderOfMost(ctx)
		targets = []*node{n}
		if n.disk == nil {
			return nil, fmt.Errorf("%s has no filesystem of its own", n.id)
		}
		if kind == "disk-full" {
			err = n.disk.fill()
			heal = func() {
				if err := n.disk.empty(); err != nil {
					nm.logger.Error("emptying the disk", "node", n.id, "err", err)
				}
				nm.restartIfEnded(n)
			}
			break
		}
		// Held 3-30 s: most stalls are shorter than chimed's --disk-failure-timeout
		// (raftfsm.DefaultFailAfter, 20 s), which a node must live through by handing its
		// shards over; about a third are longer, after which it must exit, and come back
		// once restarted.
		hold = 3*time.Second + time.Duration(nm.r.Int64N(int64(27*time.Second)))
		err = n.disk.freeze()
		heal = func() {
			n.disk.thaw()
			nm.restartIfEnded(n)
		}
	default:
		return nil, fmt.Errorf("unknown nemesis %q", kind)
	}
	if op.Targets == nil {
		op.Targets = ids(targets)
	}
	nm.logger.Info("fault", "kind", kind, "targets", op.Targets, "skew", time.Duration(op.SkewNs))
	return &fault{op: op, heal: heal, hold: hold}, err
}

// restartIfEnded starts n again if its process ended, waiting a moment for one that is
// ending: a node that gave up on its frozen disk ends only once the filesystem thaws.
func (nm *nemesis) restartIfEnded(n *node) {
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	if exited != nil {
		select {
		case <-exited:
		case <-time.After(2 * time.Second):
		}
	}
	if n.alive() {
		return
	}
	if err := n.start(); err != nil {
		nm.logger.Error("restarting", "node", n.id, "err", err)
	}
}

// nextUpgrade picks the node the upgrade nemesis moves and the build it moves it to.
func (nm *nemesis) nextUpgrade() (*node, *chimedBuild) {
	on := func(b *chimedBuild) []*node {
		var out []*node
		for _, n := range nm.c.active() {
			if n.currentBuild() == b {
				out = append(out, n)
			}
		}
		return out
	}
	if !nm.downgrading && len(on(nm.old)) == 0 {
		nm.downgrading = true
	} else if nm.downgrading && len(on(nm.current)) == 0 {
		nm.downgrading = false
	}
	from, to := nm.old, nm.current
	if nm.downgrading {
		from, to = nm.current, nm.old
	}
	ns := on(from)
	return ns[nm.r.IntN(len(ns))], to
}

// healAll removes every network fault, in every slot: a node a rule was
// made for may have left the slot since.
func (nm *nemesis) healAll() {
	for i := 1; i <= nm.c.slots; i++ {
		if err := heal(i); err != nil {
			nm.logger.Error("heal", "err", err)
		}
	}
}

// partition cuts every node of a from every node of b.
func partition(a, b []*node) error {
	for _, x := range a {
		for _, y := range b {
			if err := cut(x.i, y.ip); err != nil {
				return err
			}
			if err := cut(y.i, x.ip); err != nil {
				return err
			}
		}
	}
	return nil
}

func otherIPs(nodes []*node, n *node) []string {
	var out []string
	for _, o := range nodes {
		if o != n {
			out = append(out, o.ip)
		}
	}
	return out
}

// finalHeal ends every fault: network rules, frozen and full disks, pauses,
// dead processes (a drained and stopped member too), skew. Removed nodes stay
// down. Nodes keep the build they run, but one whose old build stopped
// refusing what the current build wrote is started on the current one: the
// old one would only refuse it again.
func (nm *nemesis) finalHeal() {
	// Each step's time is logged when it is long: the broker has been seen
	// silent while a final heal took 1.5-4 s instead of about 0.4 s.
	step, stepStart := "network", time.Now()
	next := func(name string) {
		if took := time.Since(stepStart); took > slowHealStep {
			nm.logger.Info("final heal: a slow step", "step", step, "took", took.Round(time.Millisecond))
		}
		step, stepStart = name, time.Now()
	}
	defer next("")
	nm.healAll()
	next("disks")
	members := nm.c.members()
	for _, n := range members {
		if n.disk != nil {
			n.disk.thaw()
			if err := n.disk.empty(); err != nil {
				nm.logger.Error("emptying the disk", "node", n.id, "err", err)
			}
		}
	}
	next("processes")
	var started []*node
	for _, n := range members {
		n.signal(syscall.SIGCONT)
		if n.refusedLast() && nm.current != nil {
			nm.logger.Info("final heal: the old build refused a format; restarting on the current one", "node", n.id)
			n.setBuild(nm.current)
		}
		if !n.alive() {
			if err := n.start(); err != nil {
				nm.logger.Error("restarting", "node", n.id, "err", err)
			}
			started = append(started, n)
		}
	}
	next("clocks")
	for _, n := range members {
		if slices.Contains(started, n) {
			continue // a process just started has no offset, and may not listen yet
		}
		if err := n.setClockOffset(0); err != nil {
			nm.logger.Error("healing clock skew", "node", n.id, "err", err)
		}
	}
}

// slowHealStep is how long a step of the final heal may take before it is
// logged.
const slowHealStep = 200 * time.Millisecond

func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }
