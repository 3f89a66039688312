package rpc

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// Leaders spread as evenly as the replica placement allows: no node can take
// a leadership, directly or along a chain of voters, from a node with two
// more than it has. With this cluster's defaults (8 shards, 3 replicas, 3 or
// 4 nodes) that means every node leads within one of even.
func TestPlacementBalancesLeaders(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 600 {
		nodes, shards := 3+r.IntN(6), 0
		shards = nodes + r.IntN(40)
		if trial < 200 {
			nodes, shards = 3+trial%2, 8
		}
		var cands []string
		for i := range nodes {
			cands = append(cands, fmt.Sprintf("node-%d-%d", trial, i))
		}
		desired := Placement(cands, shards, 3)
		load := map[string]int{}
		for s, d := range desired {
			if want := Placement(cands, s+1, 3)[s]; !slices.Equal(sorted(d), sorted(want)) || len(d) != 3 {
				t.Fatalf("trial %d shard %d: voters %v, want the rendezvous set %v", trial, s, d, want)
			}
			load[d[0]]++
		}
		// reach[a] holds the nodes a can take a leadership from, directly
		// or through a chain.
		reach := map[string]map[string]bool{}
		for _, a := range cands {
			reach[a] = map[string]bool{}
			for _, d := range desired {
				if slices.Contains(d[1:], a) {
					reach[a][d[0]] = true
				}
			}
		}
		for changed := true; changed; {
			changed = false
			for _, a := range cands {
				for b := range reach[a] {
					for c := range reach[b] {
						if c != a && !reach[a][c] {
							reach[a][c], changed = true, true
						}
					}
				}
			}
		}
		for _, a := range cands {
			for b := range reach[a] {
				if load[b] >= load[a]+2 {
					t.Fatalf("trial %d: %s leads %d and could take one from %s, which leads %d: %v", trial, a, load[a], b, load[b], load)
				}
			}
		}
		if trial < 200 {
			lo, hi := shards, 0
			for _, n := range cands {
				lo, hi = min(lo, load[n]), max(hi, load[n])
			}
			if hi-lo > 1 {
				t.Errorf("trial %d: %d nodes, %d shards: leaders per node %v", trial, nodes, shards, load)
			}
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
