package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// The request path. A client's request reaches its shard's leader one way,
// in chimed dev as in a cluster:
//
//  1. package rpc validates it, once, on the node the client called, and
//     calls the Cluster (the rpc.Backend) with it in its validated form
//     (shard.Request, shard.Change, raftfsm.Recurring, an id);
//  2. the Cluster splits a batch by shard (scheduleByShard) and, for each
//     shard, asks locate where it runs: on this node's replica when it leads
//     the shard, otherwise on the node that leads it, from the leader cache
//     (leaders), which a lookup fills and a not-leader answer empties;
//  3. on runs the shard's part there: a call of the replica's method, or the
//     Peer call that carries the validated request to the leader (peer.go),
//     whose replica proposes it as it is; a missing leader is waited out
//     (awaitLeader) and the leader looked up again;
//  4. errors become gRPC codes in one place (StatusOf), on the leader for a
//     Peer call and on this node for its own replica.

// LeaderWait bounds how long a request waits out a leadership change (an
// election, a transfer, a replica move) before UNAVAILABLE reaches the
// client. An election here takes one to two election timeouts (1-2 s with
// the cluster tuning).
const LeaderWait = 3 * time.Second

// awaitLeader runs op until it succeeds, fails with an error other than a
// missing leader (leaderMissing), or LeaderWait or ctx runs out, backing off
// from 20 ms to 250 ms between attempts. It returns op's last result and
// error. Every operation it wraps must be safe to run again after a missing
// leader: nothing was proposed.
func awaitLeader[T any](ctx context.Context, op func() (T, error)) (T, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.Multiplier, b.MaxInterval = 20*time.Millisecond, 2, 250*time.Millisecond
	var (
		last    T
		lastErr error
	)
	_, err := backoff.Retry(ctx, func() (T, error) {
		last, lastErr = op()
		if lastErr != nil && !leaderMissing(lastErr) {
			return last, backoff.Permanent(lastErr)
		}
		return last, lastErr
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(LeaderWait))
	if err == nil {
		return last, nil
	}
	// The operation's error, not the context's, when ctx ends the wait: a
	// missing leader stays UNAVAILABLE, which a client knows to retry.
	return last, lastErr
}

// leaderMissing reports an error that a retry after a leader change can
// cure: this node's replica lost leadership or moved, or the node asked
// answered UNAVAILABLE (it no longer leads either, or is down).
func leaderMissing(err error) bool {
	return errors.Is(err, shard.ErrNotLeader) || errors.Is(err, shard.ErrUnknownShard) ||
		status.Code(err) == codes.Unavailable
}

// target is where one shard's part of a request runs: this node's replica
// (local), or the Peer service of node, which leads the shard.
type target struct {
	local *shard.Shard
	node  string
	peer  chimev1.PeerClient
}

// leaders caches, by shard, the node last found to lead it, with a Peer
// client for it: a request to a shard this node does not lead asks nobody
// while the cache holds its leader.
type leaders struct {
	mu      sync.Mutex
	by      map[uint32]target
	lookups prometheus.Counter
}

func newLeaders() *leaders {
	return &leaders{by: map[uint32]target{}, lookups: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "chime_cluster_leader_lookups_total",
		Help: "Times this node had to find the leader of a shard it does not lead for a request: the leader cache was empty for the shard, or its leader stopped leading.",
	})}
}

func (l *leaders) get(s uint32) (target, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.by[s]
	return t, ok
}

func (l *leaders) set(s uint32, t target) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.by[s] = t
}

// forget drops node as s's leader, unless another lookup replaced it
// meanwhile.
func (l *leaders) forget(s uint32, node string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by[s].node == node {
		delete(l.by, s)
	}
}

// LeaderLookups counts the leader lookups of requests (the
// chime_cluster_leader_lookups_total metric).
func (c *Cluster) LeaderLookups() prometheus.Counter { return c.leaders.lookups }

// locate says where shard s's part of a request runs: this node's replica
// when it leads s (or, with stale, holds a replica of s at all), else the
// cached leader while this node's replica, if any, follows the same one,
// else the leader a lookup finds (LeaderNode), which is cached. Inside a gRPC handler it tells a client that routes to leaders,
// by the LeaderMovedHeader, that its map is stale.
func (c *Cluster) locate(ctx context.Context, s uint32, stale bool) (target, error) {
	var (
		replica bool   // this node holds a replica of s
		hint    string // the leader that replica follows, if it knows one
	)
	if h := c.host.Load(); h != nil {
		if r := h.Replica(s); r != nil {
			if stale || r.IsLeader() {
				return target{local: r}, nil
			}
			replica, hint = true, r.Leader()
		}
	}
	t, ok := c.leaders.get(s)
	if !ok || !cacheHolds(replica, hint, t.node) {
		c.leaders.lookups.Inc()
		node, err := c.LeaderNode(ctx, s)
		if err != nil {
			return target{}, err
		}
		if node == c.self {
			// This node's replica just won or lost leadership; the next
			// attempt sees which.
			return target{}, fmt.Errorf("%w: shard %d is changing leader", shard.ErrNotLeader, s)
		}
		cc, err := c.Conn(node)
		if err != nil {
			return target{}, err
		}
		t = target{node: node, peer: chimev1.NewPeerClient(cc)}
		c.leaders.set(s, t)
	}
	// Outside a gRPC handler (no stream in ctx) SetHeader fails, and nobody
	// is told.
	_ = grpc.SetHeader(ctx, metadata.Pairs(chimev1.LeaderMovedHeader, t.node))
	return t, nil
}

// cacheHolds reports whether locate may call cached, the node it last found
// to lead a shard, given whether this node holds a replica of the shard and
// the leader that replica follows (empty: none it knows of). A replica hears
// of a new leader within a heartbeat, sooner than a call to the cached one
// fails, and a leader that stalls (paused, or cut off without its
// connections breaking) answers nothing at all: so the cache holds only
// while the replica follows the same node. A replica that follows none is in
// an election, whose loser may well be the cached leader, stalled: a call to
// it would wait out the caller's whole deadline, where a lookup asks each
// node for a bounded time and the election ends within a second or two.
func cacheHolds(replica bool, hint, cached string) bool {
	return !replica || hint == cached
}

// on runs one shard's part of a request where locate says, waiting out a
// missing leader: local on this node's replica, remote through the leader's
// Peer service, under a context that names scope's credential (nil: a caller
// whose credential limits nothing). A leader that no longer leads is
// forgotten, and the next attempt looks the leader up again.
func on[T any](ctx context.Context, c *Cluster, s uint32, stale bool, scope shard.Scope,
	local func(*shard.Shard) (T, error), remote func(context.Context, chimev1.PeerClient) (T, error)) (T, error) {
	return awaitLeader(ctx, func() (T, error) {
		t, err := c.locate(ctx, s, stale)
		if err != nil {
			var zero T
			return zero, err
		}
		if t.local != nil {
			return local(t.local)
		}
		v, err := remote(peerContext(ctx, scope), t.peer)
		if code := status.Code(err); leaderMissing(err) || code == codes.DeadlineExceeded || code == codes.Unknown {
			// A leader that did not answer in time, or lost its leadership or
			// its connection under a change, may have stalled or gone: the
			// next request looks it up again.
			c.leaders.forget(s, t.node)
		}
		return v, err
	})
}

// peerContext marks a Peer call as made on behalf of scope's credential
// (nil: a caller whose credential limits nothing), whose grant the leader's
// authorizer then puts in the call's context for the replica to check the
// stored event against.
func peerContext(ctx context.Context, scope shard.Scope) context.Context {
	if scope == nil {
		return ctx
	}
	return ForwardContext(ctx, scope)
}

// scheduleByShard splits reqs by shard, runs schedule for every shard's part
// in parallel, and returns the results in request order. Any part's error
// fails the call; parts that did commit are found idempotently on a retry
// with the same ids.
func scheduleByShard(ctx context.Context, reqs []shard.Request, shards int,
	schedule func(ctx context.Context, id uint32, part []shard.Request) ([]shard.Result, error)) ([]shard.Result, error) {
	groups := map[uint32][]int{}
	for i, r := range reqs {
		id := shard.For(r.ID, shards)
		groups[id] = append(groups[id], i)
	}
	if len(groups) == 1 {
		for id := range groups {
			return schedule(ctx, id, reqs)
		}
	}
	out := make([]shard.Result, len(reqs))
	errs := make(chan error, len(groups))
	for id, idx := range groups {
		go func() {
			part := make([]shard.Request, len(idx))
			for j, i := range idx {
				part[j] = reqs[i]
			}
			res, err := schedule(ctx, id, part)
			if err == nil {
				for j, i := range idx {
					out[i] = res[j]
				}
			}
			errs <- err
		}()
	}
	var first error
	for range groups {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

// CancelStepSize is how many events one step of a bulk cancel lists and
// cancels in one Raft entry: large enough that the entry's cost is spread
// thin, small enough that a step commits well within a second.
const CancelStepSize = 1000

// eachShard runs part for every one of shards in parallel and returns the
// first error; the first error cancels the context the others run under.
func eachShard(ctx context.Context, shards int, part func(ctx context.Context, s uint32) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for s := range uint32(shards) {
		wg.Go(func() {
			if err := part(ctx, s); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// merge returns the first limit of the shards' List answers, each in
// due-then-id order, in that order.
func merge(parts [][]raftfsm.Record, limit int) []raftfsm.Record {
	all := slices.Concat(parts...)
	slices.SortFunc(all, func(a, b raftfsm.Record) int {
		return cmp.Or(cmp.Compare(a.Due, b.Due), strings.Compare(a.ID, b.ID))
	})
	return all[:min(limit, len(all))]
}

// mergeSchedules merges shards' schedules (each part in id order, more[i]
// set when part i's shard holds more after its last one) into the first
// limit in id order. A shard that holds more may hold schedules between its
// last one and another shard's later ones, so nothing after the first such
// last id is taken; more says something may follow what is returned.
func mergeSchedules(parts [][]raftfsm.Schedule, more []bool, limit int) ([]raftfsm.Schedule, bool) {
	all := slices.Concat(parts...)
	cut, cutSet := "", false
	for i, p := range parts {
		if more[i] && len(p) > 0 {
			if last := p[len(p)-1].ID; !cutSet || last < cut {
				cut, cutSet = last, true
			}
		}
	}
	slices.SortFunc(all, func(a, b raftfsm.Schedule) int { return strings.Compare(a.ID, b.ID) })
	if cutSet {
		n, _ := slices.BinarySearchFunc(all, cut, func(s raftfsm.Schedule, id string) int { return strings.Compare(s.ID, id) })
		all = all[:n+1]
	}
	if len(all) > limit {
		return all[:limit], true
	}
	return all, cutSet
}
