package raftfsm

import "math/bits"

// pendingSet is which of a shard's events are pending, in memory: one bit per seq ever
// assigned (seqs are dense from 1), 1.25 MB per ten million events. It lets MarkFired settle
// an event without reading it from Pebble (see MarkFired.DueKnown): reading the status of
// every fired event took a third of a draining cluster's CPU, on every replica.
//
// It always equals the due index (invariant 5): apply sets a bit where it writes a due-index
// key and clears it where it deletes one. Only the apply goroutine touches it, or the owner
// before raft starts. It is built from Pebble once per FSM and again after a Restore, by
// LoadPending or, if the owner did not call that, by the first apply.
type pendingSet struct {
	words  []uint64
	loaded bool
}

func (p *pendingSet) add(seq uint64) {
	i := seq >> 6
	if i >= uint64(len(p.words)) {
		p.words = append(p.words, make([]uint64, i+1-uint64(len(p.words)))...)
	}
	p.words[i] |= 1 << (seq & 63)
}

func (p *pendingSet) remove(seq uint64) {
	if i := seq >> 6; i < uint64(len(p.words)) {
		p.words[i] &^= 1 << (seq & 63)
	}
}

func (p *pendingSet) has(seq uint64) bool {
	i := seq >> 6
	return i < uint64(len(p.words)) && p.words[i]&(1<<(seq&63)) != 0
}

func (p *pendingSet) count() (n int) {
	for _, w := range p.words {
		n += bits.OnesCount64(w)
	}
	return n
}

// LoadPending builds the FSM's in-memory set of pending events from Pebble and calls fn for
// each pending event in due order, as ForEachPending does, in the same single pass: the shard
// owner rebuilds its timing wheel with it. It must not run concurrently with Apply or Restore:
// call it before raft starts, or from Observer.Reset (which runs on the apply goroutine). fn
// may be nil. It then starts the scan that completes the id filter (idFilter).
func (f *FSM) LoadPending(fn func(seq uint64, due int64) error) error {
	f.pending = pendingSet{words: f.pending.words[:0]}
	err := f.ForEachPending(func(seq uint64, due int64) error {
		f.pending.add(seq)
		if fn != nil {
			return fn(seq, due)
		}
		return nil
	})
	if err != nil {
		f.pending = pendingSet{}
		return err
	}
	f.pending.loaded = true
	f.scanIDFilter()
	return nil
}
