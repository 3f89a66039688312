package shard

import "github.com/chimehq/chime/wheel"

// handleTable maps the seq of each event in the wheel to its wheel handle,
// so that a cancel or a settle can take it out. The wheel holds the events
// due within the near horizon (Tuning.WheelHorizon), whose seqs may be
// anywhere among the shard's: a shard holding a month of events has a
// horizon's worth scattered over all of them. So it is a map of pages of 16
// handles, a page held while it holds a handle: 8 bytes per seq of a live
// page plus about 20 for its map entry. A map[uint64]wheel.Handle cost about
// 30 bytes per event; an array of pages of 1,024 seqs (indexed by seq, as
// before the horizon) cost 8 KiB per event when they are scattered, and one
// pointer per 1,024 seqs ever assigned, which grows for good. The zero
// Handle is never valid, so it marks an empty slot. Not safe for concurrent
// use: firing.mu guards it.
type handleTable struct {
	pages map[uint64]*handlePage
}

const handlePageBits = 4

type handlePage [1 << handlePageBits]wheel.Handle

func (t *handleTable) get(seq uint64) (wheel.Handle, bool) {
	if p := t.pages[seq>>handlePageBits]; p != nil {
		h := p[seq&(1<<handlePageBits-1)]
		return h, h != 0
	}
	return 0, false
}

func (t *handleTable) set(seq uint64, h wheel.Handle) {
	if t.pages == nil {
		t.pages = make(map[uint64]*handlePage)
	}
	p := t.pages[seq>>handlePageBits]
	if p == nil {
		p = new(handlePage)
		t.pages[seq>>handlePageBits] = p
	}
	p[seq&(1<<handlePageBits-1)] = h
}

func (t *handleTable) delete(seq uint64) { t.take(seq) }

// take removes seq's handle and returns it, with one map lookup where get
// and delete take two: every settled event on every replica comes here.
func (t *handleTable) take(seq uint64) (wheel.Handle, bool) {
	p := t.pages[seq>>handlePageBits]
	if p == nil {
		return 0, false
	}
	h := p[seq&(1<<handlePageBits-1)]
	if h == 0 {
		return 0, false
	}
	p[seq&(1<<handlePageBits-1)] = 0
	for _, other := range p {
		if other != 0 {
			return h, true
		}
	}
	delete(t.pages, seq>>handlePageBits)
	return h, true
}
