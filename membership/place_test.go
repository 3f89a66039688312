package membership

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// refScore is the documented score, built independently of Place.
func refScore(shard uint32, id string) uint64 {
	if len(id) >= 128 {
		panic("refScore: uvarint of len >= 128 not built here")
	}
	b := []byte{byte(shard >> 24), byte(shard >> 16), byte(shard >> 8), byte(shard), byte(len(id))}
	return xxhash.Sum64(append(b, id...))
}

func TestPlaceFollowsDocumentedScore(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		ids := randomIDs(rng, 1+rng.IntN(12))
		shard := rng.Uint32()
		want := slices.Clone(ids)
		slices.SortFunc(want, func(a, b string) int {
			sa, sb := refScore(shard, a), refScore(shard, b)
			switch {
			case sa > sb:
				return -1
			case sa < sb:
				return 1
			}
			return 0
		})
		if got := Place(shard, ids, len(ids)); !slices.Equal(got, want) {
			t.Fatalf("shard %d, ids %v: Place = %v, want score order %v", shard, ids, got, want)
		}
	}
}

// TestPlaceGolden pins the placement of a few shards. If it changes, every
// running cluster would move replicas on upgrade: that is a protocol change.
func TestPlaceGolden(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c", "node-d", "node-e"}
	got := map[uint32][]string{}
	for shard := uint32(0); shard < 4; shard++ {
		got[shard] = Place(shard, nodes, 3)
	}
	want := map[uint32][]string{
		0: {"node-d", "node-a", "node-c"},
		1: {"node-b", "node-e", "node-c"},
		2: {"node-e", "node-c", "node-b"},
		3: {"node-e", "node-b", "node-a"},
	}
	for shard := uint32(0); shard < 4; shard++ {
		if !slices.Equal(got[shard], want[shard]) {
			t.Errorf("Place(%d, %v, 3) = %q, want %q", shard, nodes, got[shard], want[shard])
		}
	}
}

func TestPlaceDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ids := randomIDs(rng, 9)
	for shard := uint32(0); shard < 100; shard++ {
		want := Place(shard, ids, 3)
		if len(want) != 3 {
			t.Fatalf("Place(%d) returned %d nodes, want 3", shard, len(want))
		}
		shuffled := slices.Clone(ids)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := Place(shard, shuffled, 3); !slices.Equal(got, want) {
			t.Fatalf("shard %d: order of candidates changed the result: %v vs %v", shard, got, want)
		}
	}
}

func TestPlaceEdges(t *testing.T) {
	if got := Place(1, []string{"a", "b"}, 0); len(got) != 0 {
		t.Errorf("r=0: got %v, want none", got)
	}
	if got := Place(1, nil, 3); len(got) != 0 {
		t.Errorf("no candidates: got %v, want none", got)
	}
	all := Place(5, []string{"a", "b"}, 3)
	if len(all) != 2 || !slices.Equal(all, Place(5, []string{"b", "a"}, 2)) {
		t.Errorf("fewer candidates than r: got %v, want both in score order", all)
	}
	dup := Place(5, []string{"a", "b", "a", "b", "b"}, 3)
	if !slices.Equal(dup, all) {
		t.Errorf("duplicates: got %v, want %v", dup, all)
	}
}

// TestPlaceBalance: with N nodes and S shards, a node's replica count is
// close to S*r/N. Each node lands in a shard's top r with probability
// p = r/N independently per shard, so its count is Binomial(S, p); the
// assertion is |count - S*p| <= 5*sqrt(S*p*(1-p)) (five standard
// deviations), plus that every shard gets min(r, N) distinct nodes.
func TestPlaceBalance(t *testing.T) {
	cases := []struct{ n, s, r int }{{3, 1024, 3}, {4, 4096, 3}, {5, 4096, 3}, {8, 4096, 3}, {16, 8192, 3}, {7, 4096, 5}, {10, 4096, 1}}
	for i, c := range cases {
		for seed := uint64(0); seed < 4; seed++ {
			rng := rand.New(rand.NewPCG(uint64(i), seed))
			ids := randomIDs(rng, c.n)
			count := map[string]int{}
			for shard := 0; shard < c.s; shard++ {
				set := Place(uint32(shard), ids, c.r)
				if len(set) != min(c.r, c.n) {
					t.Fatalf("n=%d: shard %d got %d replicas, want %d", c.n, shard, len(set), min(c.r, c.n))
				}
				for _, id := range set {
					count[id]++
				}
			}
			p := float64(min(c.r, c.n)) / float64(c.n)
			mean := float64(c.s) * p
			bound := 5 * math.Sqrt(float64(c.s)*p*(1-p))
			for _, id := range ids {
				if d := math.Abs(float64(count[id]) - mean); d > bound {
					t.Errorf("n=%d s=%d r=%d seed=%d: node %s holds %d replicas, want %.0f±%.1f", c.n, c.s, c.r, seed, id, count[id], mean, bound)
				}
			}
		}
	}
}

// TestPlaceAddNode: adding a node only moves replicas onto it. For every
// shard, either the set is unchanged, or the new node took the place of the
// old set's lowest-scored member and the others kept their order.
func TestPlaceAddNode(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 50; trial++ {
		r := 1 + rng.IntN(5)
		ids := randomIDs(rng, 1+rng.IntN(15))
		newNode := fmt.Sprintf("new-%d", trial)
		grown := append(slices.Clone(ids), newNode)
		moved := 0
		for shard := uint32(0); shard < 256; shard++ {
			before, after := Place(shard, ids, r), Place(shard, grown, r)
			if !slices.Contains(after, newNode) {
				if !slices.Equal(before, after) {
					t.Fatalf("r=%d, shard %d: new node not placed, yet %v became %v", r, shard, before, after)
				}
				continue
			}
			moved++
			kept := slices.DeleteFunc(slices.Clone(after), func(id string) bool { return id == newNode })
			wantKept := before
			if len(before) == r {
				wantKept = before[:r-1] // the lowest-scored member makes room
			}
			if !slices.Equal(kept, wantKept) {
				t.Fatalf("r=%d, shard %d: %v became %v; want %v plus %s", r, shard, before, after, wantKept, newNode)
			}
		}
		// Sanity: the new node gets about its share, r/(N+1) of the shards.
		want := 256 * float64(min(r, len(grown))) / float64(len(grown))
		if math.Abs(float64(moved)-want) > 5*math.Sqrt(want)+1 {
			t.Errorf("r=%d, %d nodes: new node got %d shards, want about %.0f", r, len(grown), moved, want)
		}
	}
}

// TestPlaceRemoveNode: removing a node only replaces that node. Shards that
// did not hold it keep their set; shards that did keep the others in order
// and gain one node that was not in the set.
func TestPlaceRemoveNode(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 50; trial++ {
		r := 1 + rng.IntN(5)
		ids := randomIDs(rng, 2+rng.IntN(15))
		gone := ids[rng.IntN(len(ids))]
		shrunk := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == gone })
		for shard := uint32(0); shard < 256; shard++ {
			before, after := Place(shard, ids, r), Place(shard, shrunk, r)
			if !slices.Contains(before, gone) {
				if !slices.Equal(before, after) {
					t.Fatalf("r=%d, shard %d: %s was not in %v, yet it became %v", r, shard, gone, before, after)
				}
				continue
			}
			survivors := slices.DeleteFunc(slices.Clone(before), func(id string) bool { return id == gone })
			if !slices.Equal(after[:len(survivors)], survivors) {
				t.Fatalf("r=%d, shard %d: removing %s turned %v into %v", r, shard, gone, before, after)
			}
			switch extra := after[len(survivors):]; {
			case len(shrunk) >= r && len(extra) != 1:
				t.Fatalf("r=%d, shard %d: removing %s turned %v into %v: want exactly one replacement", r, shard, gone, before, after)
			case len(extra) == 1 && slices.Contains(before, extra[0]):
				t.Fatalf("r=%d, shard %d: replacement %s was already in %v", r, shard, extra[0], before)
			case len(shrunk) < r && len(extra) != 0:
				t.Fatalf("r=%d, shard %d: no spare node, yet %v became %v", r, shard, before, after)
			}
		}
	}
}

func randomIDs(rng *rand.Rand, n int) []string {
	seen := map[string]bool{}
	ids := make([]string, 0, n)
	for len(ids) < n {
		id := fmt.Sprintf("node-%x", rng.Uint32())
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

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
