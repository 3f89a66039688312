package shard

import "github.com/chimehq/chime/wheel"

// handleTable maps the seq of each event in the wheel to its wheel handle,
// so that a cancel or a settle can take it out. Seqs are dense from 1 in each
// shard and the pending ones are mostly recent, so it is an array of pages
// of 1024 handles, a page allocated while it holds a handle and freed when
// it empties: 8 bytes per seq of a live page. A map[uint64]wheel.Handle
// cost about 30 bytes per pending event, 300 MB of a node holding ten
// million. The zero Handle is never
// valid, so it marks an empty slot. Not safe for concurrent use: firing.mu
// guards it.
type handleTable struct {
	pages []*handlePage
}

const handlePageBits = 10

type handlePage struct {
	h    [1 << handlePageBits]wheel.Handle
	used int
}

func (t *handleTable) get(seq uint64) (wheel.Handle, bool) {
	if i := seq >> handlePageBits; i < uint64(len(t.pages)) && t.pages[i] != nil {
		h := t.pages[i].h[seq&(1<<handlePageBits-1)]
		return h, h != 0
	}
	return 0, false
}

func (t *handleTable) set(seq uint64, h wheel.Handle) {
	i := seq >> handlePageBits
	if i >= uint64(len(t.pages)) {
		t.pages = append(t.pages, make([]*handlePage, i+1-uint64(len(t.pages)))...)
	}
	p := t.pages[i]
	if p == nil {
		p = new(handlePage)
		t.pages[i] = p
	}
	slot := &p.h[seq&(1<<handlePageBits-1)]
	if *slot == 0 {
		p.used++
	}
	*slot = h
}

func (t *handleTable) delete(seq uint64) {
	i := seq >> handlePageBits
	if i >= uint64(len(t.pages)) || t.pages[i] == nil {
		return
	}
	p := t.pages[i]
	slot := &p.h[seq&(1<<handlePageBits-1)]
	if *slot == 0 {
		return
	}
	*slot = 0
	if p.used--; p.used == 0 {
		t.pages[i] = nil
	}
}
