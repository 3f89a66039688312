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

// faultKinds are the nemeses --nemesis can name; "mixed" draws from all.
var faultKinds = []string{"kill", "kill-minority", "kill-leader", "kill-all", "pause", "pause-leader",
	"partition-one", "partition-halves", "partition-bridge", "partition-leader", "loss", "slow", "skew", "kafka-cut",
	"disk-full", "disk-stall"}

type nemesis struct {
	c      *cluster
	h      *history
	kinds  []string
	r      *rand.Rand
	logger *slog.Logger
}

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
	for ctx.Err() == nil {
		kind := nm.kinds[nm.r.IntN(len(nm.kinds))]
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

// pick returns k distinct random nodes.
func (nm *nemesis) pick(k int) []*node {
	ns := slices.Clone(nm.c.nodes)
	nm.r.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
	return ns[:k]
}

func (nm *nemesis) apply(ctx context.Context, kind string) (*fault, error) {
	c := nm.c
	op := checker.Op{F: "nemesis", Kind: kind, InvokeNs: time.Now().UnixNano()}
	minority := len(c.nodes) / 2
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
			targets = c.nodes
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
			ns := nm.pick(len(c.nodes))
			bridgeNode := ns[0]
			a, b := ns[1:1+len(ns[1:])/2], ns[1+len(ns[1:])/2:]
			groups = [][]*node{a, b}
			targets = []*node{bridgeNode}
			op.Targets = []string{"bridge:" + bridgeNode.id, "a:" + joinIDs(a), "b:" + joinIDs(b)}
		} else {
			rest := []*node{}
			for _, n := range c.nodes {
				if !slices.Contains(targets, n) {
					rest = append(rest, n)
				}
			}
			groups = [][]*node{targets, rest}
		}
		err = partition(groups[0], groups[1])
		heal = nm.healAll
	case "loss":
		targets = nm.pick(1 + nm.r.IntN(len(c.nodes)))
		for _, n := range targets {
			if err = lose(n.i, 0.3, otherIPs(c, n)...); err != nil {
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

// healAll removes every network fault.
func (nm *nemesis) healAll() {
	for _, n := range nm.c.nodes {
		if err := heal(n.i); err != nil {
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

func otherIPs(c *cluster, n *node) []string {
	var out []string
	for _, o := range c.nodes {
		if o != n {
			out = append(out, o.ip)
		}
	}
	return out
}

// finalHeal ends every fault: network rules, frozen and full disks, pauses, dead
// processes, skew.
func (nm *nemesis) finalHeal() {
	nm.healAll()
	for _, n := range nm.c.nodes {
		if n.disk != nil {
			n.disk.thaw()
			if err := n.disk.empty(); err != nil {
				nm.logger.Error("emptying the disk", "node", n.id, "err", err)
			}
		}
	}
	for _, n := range nm.c.nodes {
		n.signal(syscall.SIGCONT)
		if !n.alive() {
			if err := n.start(); err != nil {
				nm.logger.Error("restarting", "node", n.id, "err", err)
			}
		}
	}
	for _, n := range nm.c.nodes {
		if err := n.setClockOffset(0); err != nil {
			nm.logger.Error("healing clock skew", "node", n.id, "err", err)
		}
	}
}

func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }
