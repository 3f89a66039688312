package wheel

import (
	"errors"
	"math"
	"math/bits"
	"time"
)

const (
	slotBits  = 6
	numSlots  = 1 << slotBits
	slotMask  = numSlots - 1
	numLevels = 11 // 11*6 = 66 bits: every uint64 tick has a level.

	// overdueList holds entries whose tick the wheel has already reached:
	// added in the past, or cascaded down onto the current tick. The next
	// Advance returns them first.
	overdueList = numLevels * numSlots
	// readyLists: one list per priority of the entries Ready found due and
	// has not returned yet, lowest priority first.
	readyLists = overdueList + 1
	numLists   = readyLists + MaxPriority + 1
	noList     = math.MaxUint16 // entry is free

	slabBits = 14
	slabSize = 1 << slabBits // 16384 entries, 512 KiB per slab

	nilIndex int32 = -1
)

// MaxPriority is the highest priority an entry can have; Add treats a higher
// one as MaxPriority.
const MaxPriority = 15

// DefaultResolution is the tick length used when the caller has no reason to
// choose another: 1 ms, as in Kafka's request purgatory.
const DefaultResolution = time.Millisecond

// Handle identifies one added entry for [Wheel.Remove]. The zero Handle is
// never valid.
type Handle uint64

// Entry is an entry that fell due: the reference it was added with, its
// exact due time in Unix nanoseconds and its priority.
type Entry struct {
	Ref      uint64
	Due      int64
	Priority uint8
}

// entry is the slab element. It holds no pointer, so slabs are allocated as
// no-scan memory and the garbage collector never walks them.
type entry struct {
	ref  uint64
	due  int64
	next int32
	prev int32
	gen  uint32 // bumped when the entry is freed; stale handles no longer match
	list uint16 // which list the entry is on, or noList when free
	prio uint8  // 0 to MaxPriority
}

type list struct{ head, tail int32 }

// Wheel is a hierarchical timing wheel. It is not safe for concurrent use;
// see the package documentation for its invariants.
type Wheel struct {
	res int64 // tick length in nanoseconds

	// tick is the wheel's current tick. Every entry whose tick is at or
	// before it has been returned or sits on the overdue list; every other
	// entry sits in the slot given by slotFor(its tick) for this tick.
	tick uint64

	lists    [numLists]list
	occupied [numLevels]uint64 // bit s of occupied[L]: slot s of level L is non-empty
	count    int

	// ready counts the entries on the ready lists; readyAt is the time of
	// the Ready call that last put one there, by which they are all due.
	ready   int
	readyAt int64

	slabs [][]entry
	used  int32 // entries ever handed out; indices below it are valid
	free  int32 // head of the free list, linked through entry.next
}

// New returns an empty wheel whose current time is now (Unix nanoseconds),
// with ticks of the given resolution.
func New(now int64, resolution time.Duration) (*Wheel, error) {
	if resolution <= 0 {
		return nil, errors.New("wheel: resolution must be positive")
	}
	w := &Wheel{res: int64(resolution), free: nilIndex}
	for i := range w.lists {
		w.lists[i] = list{nilIndex, nilIndex}
	}
	w.tick = w.floorTick(now)
	return w, nil
}

// Resolution returns the tick length.
func (w *Wheel) Resolution() time.Duration { return time.Duration(w.res) }

// Now returns the wheel's current time: the start of its current tick. Every
// entry due at or before it has been returned, unless it was added since and
// waits for the next Advance.
func (w *Wheel) Now() int64 { return w.tickTime(w.tick) }

// MaxDue is the latest due time the wheel can represent: the last tick
// boundary at or before math.MaxInt64 nanoseconds.
func (w *Wheel) MaxDue() int64 { return math.MaxInt64 / w.res * w.res }

// Len returns the number of pending entries: added, and neither returned by
// Advance nor removed.
func (w *Wheel) Len() int { return w.count }

// Add adds an entry due at due (Unix nanoseconds) with a priority (0 to
// MaxPriority) and returns its handle. An entry due at or before the wheel's
// current tick is returned by the next Advance. A due time after MaxDue (the
// last tick boundary an int64 can hold, in the year 2262) is treated as
// MaxDue.
func (w *Wheel) Add(ref uint64, due int64, priority uint8) Handle {
	due = min(due, w.MaxDue())
	i := w.alloc()
	e := w.at(i)
	e.ref, e.due, e.prio = ref, due, min(priority, MaxPriority)
	w.place(i, e)
	w.count++
	return Handle(uint64(e.gen)<<32 | uint64(uint32(i)))
}

// Remove removes the entry with handle h and reports whether it was pending.
// A handle whose entry was already returned or removed is ignored.
func (w *Wheel) Remove(h Handle) bool {
	i := int32(uint32(h))
	if i < 0 || i >= w.used {
		return false
	}
	e := w.at(i)
	if e.list == noList || e.gen != uint32(h>>32) {
		return false
	}
	if e.list >= readyLists {
		w.ready--
	}
	w.unlink(i, e)
	w.release(i, e)
	w.count--
	return true
}

// Lookup returns the entry with handle h, if it is pending.
func (w *Wheel) Lookup(h Handle) (Entry, bool) {
	i := int32(uint32(h))
	if i < 0 || i >= w.used {
		return Entry{}, false
	}
	e := w.at(i)
	if e.list == noList || e.gen != uint32(h>>32) {
		return Entry{}, false
	}
	return Entry{Ref: e.ref, Due: e.due, Priority: e.prio}, true
}

// Advance moves the wheel's time to now (Unix nanoseconds) and appends to out
// every entry that fell due, in due order, after those a Ready found due and
// left. If max > 0 it stops after the
// first tick at which out holds at least max entries, leaving the rest for
// the next call; NextDue then reports a time at or before now. Advancing to a
// time before the current tick does nothing.
func (w *Wheel) Advance(now int64, out []Entry, max int) []Entry {
	target := w.floorTick(now)
	if w.ready > 0 {
		// Entries Ready found due and left come first, with the overdue
		// list: one unit, in due order, at the wheel's current tick.
		start := len(out)
		for l := numLists - 1; l >= readyLists; l-- {
			out = w.drain(l, out)
		}
		w.ready = 0
		if target >= w.tick {
			out = w.drain(overdueList, out)
		}
		sortByDue(out[start:])
	}
	if target < w.tick {
		return out
	}
	for max <= 0 || len(out) < max {
		if w.lists[overdueList].head != nilIndex {
			out = w.drain(overdueList, out)
			continue
		}
		level, slot, deadline, ok := w.next()
		if !ok || deadline > target {
			w.tick = target
			return out
		}
		w.tick = deadline
		if level == 0 {
			out = w.drain(slot, out)
		} else {
			w.cascade(level*numSlots + slot)
		}
	}
	return out
}

// Ready moves the wheel's time to now, as Advance does, and returns the
// entries due by then highest priority first: it puts every entry due by the
// tick at or before now on the list of its priority, and appends to out at
// most max of them (every one if max <= 0), emptying the highest priority's
// list first. Within a priority, entries come in the order they were put on
// its list: by due tick, and an entry added when it was due already behind
// those there. The rest wait on their lists, still pending (Remove takes
// them out), and come first in the next Ready or Advance. Ready to a time
// before the wheel's current tick leaves the time where it is, but still
// finds the entries added since that are due by then.
func (w *Wheel) Ready(now int64, out []Entry, max int) []Entry {
	target := w.floorTick(now)
	if target >= w.tick {
		for {
			if w.lists[overdueList].head != nilIndex {
				w.promote(overdueList, target)
				continue
			}
			level, slot, deadline, ok := w.next()
			if !ok || deadline > target {
				w.tick = target
				break
			}
			w.tick = deadline
			if level == 0 {
				w.promote(slot, target)
			} else {
				w.cascade(level*numSlots + slot)
			}
		}
	} else {
		// The wheel's time is past now (an Advance to a later time took
		// entries early): only an entry added since, onto the overdue list,
		// can be due by now.
		w.promote(overdueList, target)
	}
	if w.ready > 0 {
		w.readyAt = now
	}
	for l := numLists - 1; l >= readyLists && w.ready > 0 && (max <= 0 || len(out) < max); l-- {
		for i := w.lists[l].head; i != nilIndex && (max <= 0 || len(out) < max); {
			e := w.at(i)
			next := e.next
			out = append(out, Entry{Ref: e.ref, Due: e.due, Priority: e.prio})
			w.unlink(i, e)
			w.release(i, e)
			w.count--
			w.ready--
			i = next
		}
	}
	return out
}

// promote moves every entry of list l due by tick target onto the ready
// list of its priority.
func (w *Wheel) promote(l int, target uint64) {
	for i := w.lists[l].head; i != nilIndex; {
		e := w.at(i)
		next := e.next
		if w.ceilTick(e.due) <= target {
			w.unlink(i, e)
			w.push(readyLists+int(e.prio), i, e)
			w.ready++
		}
		i = next
	}
}

// NextDue returns the earliest time at which an entry can fall due, and false
// when the wheel is empty. It is a lower bound: when the next entry sits in a
// coarse slot, NextDue returns the slot's start, and Advance to that time
// returns nothing but refines the answer. A time at or before the wheel's
// current time means an Advance now returns something.
func (w *Wheel) NextDue() (int64, bool) {
	if w.count == 0 {
		return 0, false
	}
	if w.ready > 0 {
		return min(w.readyAt, w.tickTime(w.tick)), true
	}
	if w.lists[overdueList].head != nilIndex {
		return w.tickTime(w.tick), true
	}
	_, _, deadline, _ := w.next()
	return w.tickTime(deadline), true
}

// next finds the first non-empty slot: the lowest non-empty level holds the
// earliest entries, and within it the first occupied slot after the current
// one. deadline is the tick at which that slot starts.
func (w *Wheel) next() (level, slot int, deadline uint64, ok bool) {
	for level = 0; level < numLevels; level++ {
		occ := w.occupied[level]
		if occ == 0 {
			continue
		}
		shift := uint(level * slotBits)
		cur := (w.tick >> shift) & slotMask
		ahead := occ &^ (uint64(2)<<cur - 1)
		if ahead == 0 {
			// An entry at level L differs from the current tick in its
			// L-th digit and is later, so its slot is after the current
			// one. Anything else is a bug that would lose entries.
			panic("wheel: occupied slot behind the current tick")
		}
		s := uint64(bits.TrailingZeros64(ahead))
		levelStart := w.tick &^ (uint64(1)<<(shift+slotBits) - 1)
		return level, int(s), levelStart + s<<shift, true
	}
	return 0, 0, 0, false
}

// drain returns every entry of list l, which are all due, sorted by due time.
func (w *Wheel) drain(l int, out []Entry) []Entry {
	start := len(out)
	for i := w.lists[l].head; i != nilIndex; {
		e := w.at(i)
		next := e.next
		out = append(out, Entry{Ref: e.ref, Due: e.due, Priority: e.prio})
		w.release(i, e)
		w.count--
		i = next
	}
	w.clear(l)
	sortByDue(out[start:])
	return out
}

// cascade re-places every entry of list l, a slot whose start the wheel has
// just reached, at a lower level or on the overdue list.
func (w *Wheel) cascade(l int) {
	i := w.lists[l].head
	w.clear(l)
	for i != nilIndex {
		e := w.at(i)
		next := e.next
		w.place(i, e)
		i = next
	}
}

// place links entry i onto the list its due time belongs to.
func (w *Wheel) place(i int32, e *entry) {
	t := w.ceilTick(e.due)
	if t <= w.tick {
		w.push(overdueList, i, e)
		return
	}
	level := (63 - bits.LeadingZeros64((t^w.tick)|slotMask)) / slotBits
	slot := int(t>>(uint(level)*slotBits)) & slotMask
	w.push(level*numSlots+slot, i, e)
}

func (w *Wheel) push(l int, i int32, e *entry) {
	e.list = uint16(l)
	e.next = nilIndex
	tail := w.lists[l].tail
	e.prev = tail
	if tail == nilIndex {
		w.lists[l].head = i
		if l < overdueList {
			w.occupied[l/numSlots] |= 1 << (l % numSlots)
		}
	} else {
		w.at(tail).next = i
	}
	w.lists[l].tail = i
}

func (w *Wheel) unlink(i int32, e *entry) {
	l := int(e.list)
	if e.prev == nilIndex {
		w.lists[l].head = e.next
	} else {
		w.at(e.prev).next = e.next
	}
	if e.next == nilIndex {
		w.lists[l].tail = e.prev
	} else {
		w.at(e.next).prev = e.prev
	}
	if w.lists[l].head == nilIndex && l < overdueList {
		w.occupied[l/numSlots] &^= 1 << (l % numSlots)
	}
}

// clear empties list l without touching its entries.
func (w *Wheel) clear(l int) {
	w.lists[l] = list{nilIndex, nilIndex}
	if l < overdueList {
		w.occupied[l/numSlots] &^= 1 << (l % numSlots)
	}
}

func (w *Wheel) alloc() int32 {
	if i := w.free; i != nilIndex {
		w.free = w.at(i).next
		return i
	}
	if int(w.used) == len(w.slabs)*slabSize {
		if w.used > math.MaxInt32-slabSize {
			panic("wheel: more than 2^31 entries")
		}
		w.slabs = append(w.slabs, make([]entry, slabSize))
	}
	i := w.used
	w.used++
	w.at(i).gen = 1
	return i
}

// release puts entry i on the free list and invalidates its handles.
func (w *Wheel) release(i int32, e *entry) {
	e.gen++
	if e.gen == 0 {
		e.gen = 1
	}
	e.list = noList
	e.next = w.free
	w.free = i
}

func (w *Wheel) at(i int32) *entry {
	return &w.slabs[i>>slabBits][i&(slabSize-1)]
}

// floorTick is the tick containing time t: the last tick boundary at or
// before it.
func (w *Wheel) floorTick(t int64) uint64 {
	if t <= 0 {
		return 0
	}
	return uint64(t / w.res)
}

// ceilTick is the first tick boundary at or after t: the tick an entry due at
// t belongs to, so that it is never returned before t.
func (w *Wheel) ceilTick(t int64) uint64 {
	if t <= 0 {
		return 0
	}
	q := uint64(t / w.res)
	if t%w.res != 0 {
		q++
	}
	return q
}

func (w *Wheel) tickTime(t uint64) int64 {
	if t > uint64(math.MaxInt64/w.res) {
		return math.MaxInt64
	}
	return int64(t) * w.res
}

// sortByDue sorts entries by due time. It is slices.SortFunc specialised to
// Entry: the comparison inlines, which the generic version's function value
// cannot, and sorting a tick's entries is most of the cost of firing them.
func sortByDue(es []Entry) {
	sorted := true // common: many entries share a due time, or came in order
	for i := 1; i < len(es) && sorted; i++ {
		sorted = es[i-1].Due <= es[i].Due
	}
	if sorted {
		return
	}
	for len(es) > 16 {
		// Median of three as the pivot, moved to es[0].
		m, last := len(es)/2, len(es)-1
		if es[m].Due < es[0].Due {
			es[m], es[0] = es[0], es[m]
		}
		if es[last].Due < es[0].Due {
			es[last], es[0] = es[0], es[last]
		}
		if es[last].Due < es[m].Due {
			es[last], es[m] = es[m], es[last]
		}
		es[0], es[m] = es[m], es[0]
		pivot := es[0].Due
		// Hoare partition: es[1:i] <= pivot, es[j+1:] >= pivot.
		i, j := 1, last
		for {
			for i <= j && es[i].Due < pivot {
				i++
			}
			for i <= j && es[j].Due > pivot {
				j--
			}
			if i >= j {
				break
			}
			es[i], es[j] = es[j], es[i]
			i++
			j--
		}
		es[0], es[j] = es[j], es[0]
		// Recurse into the smaller side, loop on the larger: O(log n) stack.
		if j < len(es)-j {
			sortByDue(es[:j])
			es = es[j+1:]
		} else {
			sortByDue(es[j+1:])
			es = es[:j]
		}
	}
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].Due < es[j-1].Due; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}
