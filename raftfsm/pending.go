package raftfsm

import (
	"math/bits"

	"github.com/cockroachdb/pebble/v2"
)

// pendingSet is which of a shard's events are pending, in memory: one bit per seq, in pages
// of 65,536 seqs (8 KiB) held only while one of their seqs is pending, 1.25 MB per ten
// million pending events. It lets MarkFired settle an event without reading it from Pebble
// (see MarkFired.DueKnown): reading the status of every fired event took a third of a
// draining cluster's CPU, on every replica. Pages, rather than one bit per seq ever
// assigned, because seqs only grow: a shard that schedules 5,000 events a second assigns 150
// billion in a year, 20 GB of bits of which only the recent ones are ever set.
type pendingSet struct {
	pages map[uint64]*pendingPage
}

const pendingPageBits = 16

type pendingPage struct {
	words [1 << pendingPageBits / 64]uint64
	n     int // bits set
}

func (p *pendingSet) add(seq uint64) {
	if p.pages == nil {
		p.pages = make(map[uint64]*pendingPage)
	}
	pg := p.pages[seq>>pendingPageBits]
	if pg == nil {
		pg = new(pendingPage)
		p.pages[seq>>pendingPageBits] = pg
	}
	w, bit := &pg.words[seq&(1<<pendingPageBits-1)>>6], uint64(1)<<(seq&63)
	if *w&bit == 0 {
		*w |= bit
		pg.n++
	}
}

func (p *pendingSet) remove(seq uint64) {
	pg := p.pages[seq>>pendingPageBits]
	if pg == nil {
		return
	}
	w, bit := &pg.words[seq&(1<<pendingPageBits-1)>>6], uint64(1)<<(seq&63)
	if *w&bit != 0 {
		*w &^= bit
		if pg.n--; pg.n == 0 {
			delete(p.pages, seq>>pendingPageBits)
		}
	}
}

func (p *pendingSet) has(seq uint64) bool {
	pg := p.pages[seq>>pendingPageBits]
	return pg != nil && pg.words[seq&(1<<pendingPageBits-1)>>6]&(1<<(seq&63)) != 0
}

func (p *pendingSet) count() (n int) {
	for _, pg := range p.pages {
		for _, w := range pg.words {
			n += bits.OnesCount64(w)
		}
	}
	return n
}

// pendingMirror is the FSM's pendingSet and how it is built. Once loaded it always equals
// the due index (invariant 5): apply sets a bit where it writes a due-index key and clears it
// where it deletes one. Until then apply answers "is it pending?" from Pebble (applier.status),
// which gives the same answer more slowly, so a replica's decisions never depend on it.
//
// It is built in the background, because a shard holding a hundred million events has that
// many due-index keys, and reading them all before the shard could fire took longer than a
// restart may: a build starts when the owner loads the wheel (LoadPending) or at the first
// apply, and reads the due index with its own iterator while apply goes on. Apply records
// every seq it adds and removes meanwhile, from before the iterator opens; the first apply
// after the build ends adds those and then removes those to and from what the build read.
// That is exact whatever moment the iterator saw: a seq is added once (when it is created)
// and removed at most once, after, so replaying an add or a remove the iterator already saw
// changes nothing. Only the apply goroutine touches it (or the owner before raft starts),
// except the build's own set, which apply reads once the build is done.
//
// The build counts the due times it reads too (dueCounts), and apply the ones it adds and
// removes once loaded (deltas, taken into FSM.dues when its batch commits). Counts are not
// idempotent as set bits are, so taking the build in replays an add only for a seq the
// iterator did not see, and a remove only for one in the set: an add before the iterator
// opened is in the set already, and a remove of a seq the iterator did not see (added and
// removed meanwhile, or removed before it opened) finds no bit.
type pendingMirror struct {
	set    pendingSet
	loaded bool
	build  *pendingBuild // the running or finished build while !loaded
	deltas []dueDelta    // due counts changed by the apply running, once loaded
}

// pendingChange is a seq apply added or removed while a build ran, and its due time.
type pendingChange struct {
	seq uint64
	due int64
}

type pendingBuild struct {
	adds, removes []pendingChange // made by apply since the build began
	stop, done    chan struct{}
	set           pendingSet // the build goroutine's until done is closed
	dues          dueCounts  // likewise: the due times of set
	ok            bool       // read the whole due index
}

func (m *pendingMirror) add(seq uint64, due int64) {
	switch {
	case m.loaded:
		m.set.add(seq)
		m.deltas = noteDue(m.deltas, due, 1)
	case m.build != nil:
		m.build.adds = append(m.build.adds, pendingChange{seq, due})
	}
}

func (m *pendingMirror) remove(seq uint64, due int64) {
	switch {
	case m.loaded:
		m.set.remove(seq)
		m.deltas = noteDue(m.deltas, due, -1)
	case m.build != nil:
		m.build.removes = append(m.build.removes, pendingChange{seq, due})
	}
}

// has reports whether seq is pending, and known, false until the mirror is loaded.
func (m *pendingMirror) has(seq uint64) (pending, known bool) {
	if !m.loaded {
		return false, false
	}
	return m.set.has(seq), true
}

// startPending begins building the mirror, unless it is loaded or a build runs. Called on the
// apply goroutine (or before it exists).
func (f *FSM) startPending() {
	m := &f.pending
	if m.loaded || m.build != nil {
		return
	}
	b := &pendingBuild{stop: make(chan struct{}), done: make(chan struct{})}
	m.build = b
	st, lower, upper := f.st, appendShardTag(nil, f.shard, tagDue), appendShardTag(nil, f.shard, tagDue+1)
	st.scans.Add(1)
	go func() {
		defer st.scans.Done()
		defer close(b.done)
		select { // one build at a time per node
		case st.pendingSlot <- struct{}{}:
			defer func() { <-st.pendingSlot }()
		case <-b.stop:
			return
		case <-st.closing:
			return
		}
		b.ok = b.read(f.db, lower, upper, st.closing, st.knobs.PendingBuild)
	}()
}

// read adds the seq of every key in [lower, upper) of the due index to b.set and reports
// whether it read them all. hook (Knobs.PendingBuild), if set, runs once the iterator is open.
func (b *pendingBuild) read(db *pebble.DB, lower, upper []byte, closing <-chan struct{}, hook func(stop <-chan struct{})) bool {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return false
	}
	defer func() { _ = it.Close() }()
	if hook != nil {
		hook(b.stop)
	}
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		due, seq, err := parseDueKey(it.Key())
		if err != nil {
			return false
		}
		b.set.add(seq)
		b.dues.add(due, 1)
		if n++; n%4096 == 0 {
			select {
			case <-b.stop:
				return false
			case <-closing:
				return false
			default:
			}
		}
	}
	return it.Error() == nil
}

// pollPending takes in a finished build, or starts one. Called on the apply goroutine (or
// before it exists), before an apply.
func (f *FSM) pollPending() {
	m := &f.pending
	if m.loaded {
		return
	}
	if m.build == nil {
		f.startPending()
	}
	b := m.build
	select {
	case <-b.done:
	default:
		return
	}
	m.build = nil
	if !b.ok { // a read error or a closing store: the next apply starts another
		return
	}
	for _, c := range b.adds {
		if !b.set.has(c.seq) {
			b.set.add(c.seq)
			b.dues.add(c.due, 1)
		}
	}
	for _, c := range b.removes {
		if b.set.has(c.seq) {
			b.set.remove(c.seq)
			b.dues.add(c.due, -1)
		}
	}
	m.set, m.loaded = b.set, true
	f.mu.Lock()
	f.dues, f.duesLoaded = b.dues, true
	f.mu.Unlock()
}

// stopPending ends a running build and forgets the mirror: Restore replaces what it
// mirrors, and Close ends the FSM. Called on the apply goroutine, or after it has stopped.
func (f *FSM) stopPending() {
	f.pendingMu.Lock()
	defer f.pendingMu.Unlock()
	if b := f.pending.build; b != nil {
		close(b.stop)
		<-b.done
	}
	f.pending = pendingMirror{}
	f.mu.Lock()
	f.dues, f.duesLoaded = dueCounts{}, false
	f.mu.Unlock()
}

// LoadPending starts building the FSM's in-memory set of pending events (see pendingMirror)
// and calls fn for each pending event due before before, in due order, as ForEachPendingIn
// does: the shard owner loads its timing wheel with it. It must not run concurrently with
// Apply or Restore: call it before raft starts, or from Observer.Reset (which runs on the
// apply goroutine). fn may be nil. It then starts the scan that completes the id filter
// (idFilter).
func (f *FSM) LoadPending(before int64, fn func(seq uint64, due int64, p Policy) error) error {
	f.pendingMu.Lock()
	f.startPending()
	f.pendingMu.Unlock()
	if fn != nil {
		if err := f.ForEachPendingIn(minDue, before, fn); err != nil {
			return err
		}
	}
	f.scanIDFilter()
	return nil
}

// tryTakePending takes in a finished build of the pending set, with its due counts, as the
// next apply would, unless something holds pendingMu (an apply running, which takes it in
// itself). Called by readers.
func (f *FSM) tryTakePending() {
	if !f.pendingMu.TryLock() {
		return
	}
	defer f.pendingMu.Unlock()
	m := &f.pending
	if m.loaded || m.build == nil {
		return
	}
	select {
	case <-m.build.done:
		f.pollPending()
	default:
	}
}
