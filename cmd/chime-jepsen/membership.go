package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// The membership nemesis changes who the members are, as an operator does,
// while the workload runs: it adds a node, drains a node and stops it, kills
// a node, removes it for good and adds a fresh one in its place, and starts
// a drained node again. The running members stay within --nodes ± 1. Each
// change opens a fault window that the next heal closes without undoing it:
// the window is the time the rebalancer moves replicas under load.
//
// Like a careful operator, it drains or removes a node only once every shard
// is back at its replication factor: two removals in a row can leave a shard
// with one live voter of two, which no Raft change can repair.

const (
	// drainLimit bounds how long a drain may take before the node is
	// stopped anyway (then it is a kill: its replicas move after chimed's
	// --dead-timeout, which the driver sets to 1m).
	drainLimit = 90 * time.Second
	// settleLimit bounds the wait for every shard to be at its replication
	// factor before a drain or a removal.
	settleLimit = 45 * time.Second
)

// membershipChange makes one membership change and returns its targets,
// each "<action>:<node>".
func (nm *nemesis) membershipChange(ctx context.Context, size int) ([]string, error) {
	c := nm.c
	running := c.active()
	var parked []*node
	for _, n := range c.members() {
		if n.isParked() {
			parked = append(parked, n)
		}
	}
	var grow, shrink []string
	c.mu.Lock()
	free := c.freeSlotLocked() > 0
	c.mu.Unlock()
	if len(running) < size+1 && free {
		grow = append(grow, "join")
	}
	if len(running) < size+1 && len(parked) > 0 {
		grow = append(grow, "restart")
	}
	if len(running) > size-1 {
		shrink = append(shrink, "drain")
	}
	if len(running) >= size {
		shrink = append(shrink, "replace")
	}
	choices := append(slices.Clone(grow), shrink...)
	if len(choices) == 0 {
		return nil, errors.New("no membership change keeps the cluster within its size")
	}
	action := choices[nm.r.IntN(len(choices))]
	if slices.Contains(shrink, action) {
		err := c.waitConverged(ctx, settleLimit)
		if err == nil {
			// A member whose process ended by itself may still be reported
			// a voter, even a leader, until the others notice.
			if down := slices.DeleteFunc(slices.Clone(running), (*node).alive); len(down) > 0 {
				err = fmt.Errorf("members %s are down", joinIDs(down))
			}
		}
		if err != nil {
			if len(grow) == 0 {
				return nil, fmt.Errorf("no %s: %w", action, err)
			}
			nm.logger.Warn("membership: shards not at their replication factor; growing instead", "instead-of", action, "err", err)
			action = grow[nm.r.IntN(len(grow))]
		}
	}
	switch action {
	case "join":
		n, err := nm.addNode()
		return []string{"join:" + n.id}, err
	case "restart":
		n := parked[nm.r.IntN(len(parked))]
		return []string{"restart:" + n.id}, n.start()
	case "drain":
		n := running[nm.r.IntN(len(running))]
		return []string{"drain:" + n.id}, nm.drainAndStop(ctx, n, running)
	default: // replace
		n := running[nm.r.IntN(len(running))]
		targets := []string{"remove:" + n.id}
		if err := nm.remove(ctx, n, running); err != nil {
			return targets, err
		}
		added, err := nm.addNode()
		return append(targets, "join:"+added.id), err
	}
}

// freeSlotLocked is a slot no member occupies (a removed node's is free),
// or 0. c.mu is held.
func (c *cluster) freeSlotLocked() int {
	for i := 1; i <= c.slots; i++ {
		if !slices.ContainsFunc(c.nodes, func(n *node) bool { return n.i == i }) {
			return i
		}
	}
	return 0
}

// addNode starts a new node, with a new id and an empty data directory, in a
// free slot, joining through every running member.
func (nm *nemesis) addNode() (*node, error) {
	c := nm.c
	var seeds []string
	for _, m := range c.active() {
		if m.alive() {
			seeds = append(seeds, m.ip+":7072")
		}
	}
	c.mu.Lock()
	slot := c.freeSlotLocked()
	if slot == 0 {
		c.mu.Unlock()
		return nil, errors.New("no free slot for a new node")
	}
	n := c.newNode(slot, fmt.Sprintf("n%d", c.nextID))
	c.nextID++
	n.join = strings.Join(seeds, ",")
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	if err := c.giveDisk(n); err != nil {
		return n, err
	}
	return n, n.start()
}

// drainAndStop drains n as chimectl drain does, until it is safe to stop,
// and stops it gracefully; it stays down (parked) until started again.
func (nm *nemesis) drainAndStop(ctx context.Context, n *node, running []*node) error {
	deadline := time.Now().Add(drainLimit)
	var last string
	for ctx.Err() == nil {
		via := n
		if !via.alive() {
			via = anyAlive(running, n)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := via.admin().Drain(cctx, &chimev1.DrainRequest{Node: n.id})
		cancel()
		if err == nil && resp.SafeToStop {
			last = ""
			break
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d replicas and %d leaderships remain", resp.ReplicasRemaining, resp.LeadersRemaining)
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if exit := n.stop(stopGrace); exit != "" && exit != "exit status 0" {
		nm.logger.Warn("a drained node's graceful stop ended otherwise than with exit status 0", "node", n.id, "exit", exit)
	}
	n.mu.Lock()
	n.parked = true
	n.mu.Unlock()
	switch {
	case last == "":
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("the run ended with the drain of %s unfinished (%s); stopped it anyway", n.id, last)
	default:
		return fmt.Errorf("drain of %s unfinished after %v (%s); stopped it anyway", n.id, drainLimit, last)
	}
}

// remove kills n and removes it for good (RemoveNode, forced: it was alive
// within the dead timeout), through another running member. A node the
// cluster would not remove is started again and stays a member.
func (nm *nemesis) remove(ctx context.Context, n *node, running []*node) error {
	n.kill()
	deadline := time.Now().Add(settleLimit)
	var err error
	for ctx.Err() == nil {
		via := anyAlive(running, n)
		if via == nil {
			err = errors.New("no running member to ask")
		} else {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = via.admin().RemoveNode(cctx, &chimev1.RemoveNodeRequest{Node: n.id, Force: true})
			cancel()
		}
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		if serr := n.start(); serr != nil {
			nm.logger.Error("restarting a node the cluster did not remove", "node", n.id, "err", serr)
		}
		return fmt.Errorf("removing %s: %w", n.id, err)
	}
	c := nm.c
	c.mu.Lock()
	c.nodes = slices.DeleteFunc(c.nodes, func(m *node) bool { return m == n })
	c.removed = append(c.removed, n)
	c.mu.Unlock()
	n.closeClients()
	return nil
}

// anyAlive is a running node of ns other than not, or nil.
func anyAlive(ns []*node, not *node) *node {
	for _, m := range ns {
		if m != not && m.alive() {
			return m
		}
	}
	return nil
}
