package membership

import (
	"encoding/binary"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Place returns the desired replica set of shard among candidates: the r
// candidates with the highest rendezvous (highest-random-weight) score, in
// score order, highest first; all of them when there are fewer than r.
// Duplicate candidates count once.
//
// The score of a node for a shard is xxhash64 of the shard as 4 big-endian
// bytes, then the length of the node id as a uvarint, then the id. A node's
// score does not depend on the other candidates, which gives the properties
// the leaders rely on: every node computes the same set from the same
// candidates, adding a node changes a shard's set only by that node replacing
// the lowest-scored member, and removing a node changes only the sets that
// held it. The encoding is part of the protocol: changing it moves replicas
// on every shard.
func Place(shard uint32, candidates []string, r int) []string {
	if r <= 0 || len(candidates) == 0 {
		return nil
	}
	type scored struct {
		id    string
		score uint64
	}
	all := make([]scored, 0, len(candidates))
	var buf []byte
	for _, id := range candidates {
		buf = binary.BigEndian.AppendUint32(buf[:0], shard)
		buf = binary.AppendUvarint(buf, uint64(len(id)))
		buf = append(buf, id...)
		all = append(all, scored{id: id, score: xxhash.Sum64(buf)})
	}
	slices.SortFunc(all, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
	out := make([]string, 0, min(r, len(all)))
	for i, s := range all {
		if i > 0 && s.id == all[i-1].id {
			continue // equal ids have equal scores, so duplicates are adjacent
		}
		out = append(out, s.id)
		if len(out) == r {
			break
		}
	}
	return out
}

// Placement computes every shard's desired voters over candidates by
// rendezvous hashing (Place), then puts a preferred leader first so that leaders
// spread evenly: shard by shard, the desired voter with the fewest
// leaderships so far, then moves that lower the busiest node's count while
// any helps. Every node computes the same result from the same candidates.
func Placement(candidates []string, shards, replication int) [][]string {
	desired := make([][]string, shards)
	load := map[string]int{}
	for s := range shards {
		d := Place(uint32(s), candidates, replication)
		best := 0
		for i, n := range d {
			if load[n] < load[d[best]] {
				best = i
			}
		}
		if len(d) > 0 {
			load[d[best]]++
			d[0], d[best] = d[best], d[0]
		}
		desired[s] = d
	}
	balanceLeaders(desired, candidates, load)
	return desired
}

// balanceLeaders moves preferred leaderships until no node is two below
// another one it can take from, directly or along a chain: node a can take a
// shard from b when b is its preferred leader and a is one of its voters. A
// chain a <- b <- c moves one shard from c to b and one from b to a, so only
// the two ends change count. This reaches the most even spread the replica
// placement allows (a node with few replicas may not get its share).
func balanceLeaders(desired [][]string, candidates []string, load map[string]int) {
	for {
		// The least-loaded node that can still gain, ties by id.
		improved := false
		order := slices.Clone(candidates)
		slices.SortStableFunc(order, func(a, b string) int { return load[a] - load[b] })
		for _, v := range order {
			if path := takeChain(desired, load, v); path != nil {
				// path[i] is the shard the i-th node of the chain takes
				// from the next one.
				for _, s := range path {
					d := desired[s]
					i := slices.Index(d, takerOf(desired, path, s, v))
					load[d[0]]--
					load[d[i]]++
					d[0], d[i] = d[i], d[0]
				}
				improved = true
				break
			}
		}
		if !improved {
			return
		}
	}
}

// takeChain finds, by breadth-first search from v, a shortest chain of
// shards ending at a node with at least two more leaderships than v, and
// returns the shards in the order their leaderships move (from the far end
// back to v).
func takeChain(desired [][]string, load map[string]int, v string) []int {
	type step struct {
		node  string
		shard int // shard by which node was reached
		prev  int // index of the previous step
	}
	steps := []step{{node: v, shard: -1, prev: -1}}
	seen := map[string]bool{v: true}
	for i := 0; i < len(steps); i++ {
		a := steps[i].node
		for s, d := range desired {
			if len(d) == 0 || seen[d[0]] || !slices.Contains(d[1:], a) {
				continue
			}
			b := d[0]
			seen[b] = true
			steps = append(steps, step{node: b, shard: s, prev: i})
			if load[b] >= load[v]+2 {
				var path []int
				for j := len(steps) - 1; steps[j].prev >= 0; j = steps[j].prev {
					path = append(path, steps[j].shard)
				}
				return path
			}
		}
	}
	return nil
}

// takerOf returns which node takes shard s along path: the node before it in
// the chain, which for the last shard is v.
func takerOf(desired [][]string, path []int, s int, v string) string {
	i := slices.Index(path, s)
	if i == len(path)-1 {
		return v
	}
	return desired[path[i+1]][0]
}
