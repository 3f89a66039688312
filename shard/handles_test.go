package shard

import (
	"math/rand/v2"
	"testing"

	"github.com/chimehq/chime/wheel"
)

// TestHandleTable drives the table and a map with the same random sets and
// deletes, over seqs that share pages and seqs far apart, and compares every
// lookup; pages must be freed once empty.
func TestHandleTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var tab handleTable
	model := map[uint64]wheel.Handle{}
	for i := range 200_000 {
		seq := rng.Uint64N(5000)
		if i%7 == 0 {
			seq = 1<<20 + rng.Uint64N(1<<16)
		}
		if rng.IntN(3) == 0 {
			tab.delete(seq)
			delete(model, seq)
		} else {
			h := wheel.Handle(rng.Uint64N(1<<40) + 1)
			tab.set(seq, h)
			model[seq] = h
		}
		probe := rng.Uint64N(5000)
		got, ok := tab.get(probe)
		want, wantOK := model[probe]
		if got != want || ok != wantOK {
			t.Fatalf("op %d: get(%d) = %d, %v; want %d, %v", i, probe, got, ok, want, wantOK)
		}
	}
	for seq := range model {
		tab.delete(seq)
	}
	if len(tab.pages) != 0 {
		t.Fatalf("%d pages still held with every handle deleted", len(tab.pages))
	}
	if _, ok := tab.get(0); ok {
		t.Fatal("get(0) found a handle in an empty table")
	}
}
