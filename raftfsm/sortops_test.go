package raftfsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSortGroupOrdersByKeyThenOrderMade: whichever way a group is sorted (radix on the
// prefix, pdqsort, or found sorted), the writes come out by key, writes to one key in the
// order they were made: a key set and then deleted in one apply must stay deleted.
func TestSortGroupOrdersByKeyThenOrderMade(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name   string
		n      int
		keyLen int // bytes after the tag; 0: variable, as ids
		spread uint64
	}{
		{"statuses, seqs close together", 5000, 8, 3000},
		{"settled index, times and seqs", 5000, 16, 1 << 40},
		{"many ties", 2000, 16, 16},
		{"small group", 100, 16, 1 << 20},
		{"ids", 3000, 0, 1 << 20},
		{"already sorted", 1000, 8, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &applier{}
			base := rng.Uint64()
			for i := range tc.n {
				k := appendShardTag(nil, 7, tagStatus)
				switch {
				case tc.keyLen == 0:
					k = fmt.Appendf(k, "id-%d", rng.IntN(tc.n))
				case tc.spread == 0:
					k = binary.BigEndian.AppendUint64(k, base+uint64(i))
				default:
					k = binary.BigEndian.AppendUint64(k, base+rng.Uint64N(tc.spread))
				}
				if tc.keyLen == 16 {
					k = binary.BigEndian.AppendUint64(k, rng.Uint64N(tc.spread))
				}
				if i%3 == 0 {
					a.del(k)
				} else {
					a.set(k, []byte{byte(i)})
				}
			}
			want := slices.Clone(a.ops)
			slices.SortStableFunc(want, func(x, y op) int {
				return bytes.Compare(a.buf[x.k0:x.k1], a.buf[y.k0:y.k1])
			})
			got := slices.Clone(a.ops)
			a.sortGroup(got, make([]op, len(got)))
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("write %d of %d: key %x (made at %d), want %x (made at %d)", i, len(got),
						a.buf[got[i].k0:got[i].k1], got[i].k0, a.buf[want[i].k0:want[i].k1], want[i].k0)
				}
			}
		})
	}
}

// BenchmarkSortGroup: the statuses and settled-index keys of a drain's apply, in fire order.
func BenchmarkSortGroup(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	a := &applier{}
	for range 20000 {
		k := appendShardTag(nil, 7, tagSettled)
		k = binary.BigEndian.AppendUint64(k, 1e18+rng.Uint64N(2e9))
		k = binary.BigEndian.AppendUint64(k, 1e6+rng.Uint64N(1e6))
		a.set(k, make([]byte, 8))
	}
	g, scratch := make([]op, len(a.ops)), make([]op, len(a.ops))
	for _, sorter := range []string{"radix", "pdqsort"} {
		b.Run(sorter, func(b *testing.B) {
			for b.Loop() {
				copy(g, a.ops)
				if sorter == "radix" {
					a.sortGroup(g, scratch)
				} else {
					slices.SortFunc(g, a.compareOps)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(g)), "ns/write")
		})
	}
}
