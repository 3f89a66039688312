package wheel

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The wheel is checked against a reference model: a plain list of entries,
// scanned in full on every operation. Operations are decoded from a byte
// stream so that the same interpreter serves the seeded property test and the
// fuzz target.

type modelEntry struct {
	ref   uint64
	due   int64
	prio  uint8
	h     Handle
	alive bool
	ready bool // found due by a Ready that did not return it
}

type model struct {
	res     int64
	entries []modelEntry
}

func (m *model) ceilTick(t int64) uint64 {
	if t <= 0 {
		return 0
	}
	q := uint64(t / m.res)
	if t%m.res != 0 {
		q++
	}
	return q
}

func (m *model) floorTick(t int64) uint64 {
	if t <= 0 {
		return 0
	}
	return uint64(t / m.res)
}

func (m *model) alive() int {
	n := 0
	for _, e := range m.entries {
		if e.alive {
			n++
		}
	}
	return n
}

// stream hands out values from fuzz or random bytes; it yields zeros once
// exhausted so every input decodes to a valid program.
type stream struct{ b []byte }

func (s *stream) byte() byte {
	if len(s.b) == 0 {
		return 0
	}
	v := s.b[0]
	s.b = s.b[1:]
	return v
}

func (s *stream) u64() uint64 {
	var buf [8]byte
	n := copy(buf[:], s.b)
	s.b = s.b[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

// upTo returns a value in [0, n).
func (s *stream) upTo(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return int64(s.u64() % uint64(n))
}

var resolutions = []time.Duration{time.Millisecond, time.Nanosecond, time.Microsecond, 7 * time.Millisecond, time.Second}

const year = int64(365 * 24 * time.Hour)

// runProgram interprets the stream as a sequence of operations on a wheel and
// a model, failing on the first disagreement.
func runProgram(t *testing.T, data []byte) {
	s := &stream{b: data}
	res := resolutions[int(s.byte())%len(resolutions)]
	start := int64(1_700_000_000_000_000_000) + s.upTo(int64(time.Hour))
	w, err := New(start, res)
	if err != nil {
		t.Fatal(err)
	}
	m := &model{res: int64(res)}
	now := start
	var nextRef uint64
	var out []Entry

	for step := 0; len(s.b) > 0 && step < 5000; step++ {
		switch op := s.byte() % 14; op {
		case 0, 1, 2, 3, 4:
			due := min(pickDue(s, m, now), w.MaxDue())
			prio := s.byte() % (MaxPriority + 2) // MaxPriority+1 is clamped
			h := w.Add(nextRef, due, prio)
			m.entries = append(m.entries, modelEntry{ref: nextRef, due: due, prio: min(prio, MaxPriority), h: h, alive: true})
			nextRef++
		case 5, 6:
			if len(m.entries) == 0 {
				continue
			}
			i := s.upTo(int64(len(m.entries)))
			got := w.Remove(m.entries[i].h)
			if got != m.entries[i].alive {
				t.Fatalf("step %d: Remove(entry %d) = %v, model says alive=%v", step, i, got, m.entries[i].alive)
			}
			m.entries[i].alive = false
		case 7:
			// A handle that was never issued, or a stale generation.
			h := Handle(s.u64())
			for _, e := range m.entries {
				if e.h == h && e.alive {
					h = 0
				}
			}
			if w.Remove(h) {
				t.Fatalf("step %d: Remove(%#x) of a foreign handle succeeded", step, h)
			}
		case 8, 9, 10:
			now = pickNow(s, w, now)
			max := 0
			if op == 10 {
				max = 1 + int(s.upTo(8))
			}
			out = checkAdvance(t, step, w, m, now, max, out[:0])
		case 11:
			checkNextDue(t, step, w, m)
		case 12, 13:
			now = pickNow(s, w, now)
			max := 0
			if op == 13 {
				max = 1 + int(s.upTo(8))
			}
			out = checkReady(t, step, w, m, now, max, out[:0])
		}
		if w.Len() != m.alive() {
			t.Fatalf("step %d: Len() = %d, model has %d", step, w.Len(), m.alive())
		}
	}
	// Drain everything by sleeping on NextDue, as an owner does: every entry
	// must come out once, and reaching the next one takes at most one empty
	// wake-up per level.
	for idle := 0; w.Len() > 0; {
		next, ok := w.NextDue()
		if !ok {
			t.Fatalf("final drain: NextDue reports empty with Len() = %d", w.Len())
		}
		if next < now {
			next = now
		}
		now = next
		out = checkAdvance(t, -1, w, m, now, 0, out[:0])
		if len(out) > 0 {
			idle = 0
		} else if idle++; idle > numLevels {
			t.Fatalf("final drain: %d wake-ups at NextDue returned nothing", idle)
		}
	}
	if m.alive() != 0 {
		t.Fatalf("final drain: model still has %d entries", m.alive())
	}
}

func pickDue(s *stream, m *model, now int64) int64 {
	switch s.byte() % 10 {
	case 0: // in the past
		return now - s.upTo(int64(10*time.Second))
	case 1: // on the current tick
		return int64(m.floorTick(now))*m.res + s.upTo(m.res)
	case 2: // exactly on a near tick boundary
		return (int64(m.floorTick(now)) + s.upTo(130)) * m.res
	case 3: // a few ticks ahead
		return now + s.upTo(200*m.res)
	case 4: // up to an hour ahead
		return now + s.upTo(int64(time.Hour))
	case 5: // up to twelve years ahead
		return now + s.upTo(12*year)
	case 6: // the same due time as an earlier entry
		if len(m.entries) > 0 {
			return m.entries[s.upTo(int64(len(m.entries)))].due
		}
		return now
	case 7: // extremes
		switch s.byte() % 4 {
		case 0:
			return math.MaxInt64 - s.upTo(int64(time.Second))
		case 1:
			return 0
		case 2:
			return -s.upTo(math.MaxInt64)
		default:
			return math.MinInt64
		}
	case 8: // just past a power-of-64 tick boundary: where levels meet
		b := int64(1) << (6 * (1 + s.upTo(5)))
		t := (int64(m.floorTick(now))/b + 1 + s.upTo(2)) * b
		return t*m.res + s.upTo(3) - 1
	default:
		return now + s.upTo(int64(time.Minute))
	}
}

func pickNow(s *stream, w *Wheel, now int64) int64 {
	switch s.byte() % 8 {
	case 0: // stand still
		return now
	case 1: // less than a tick
		return now + s.upTo(int64(w.Resolution()))
	case 2: // a few ticks
		return now + s.upTo(300*int64(w.Resolution()))
	case 3, 4: // to the next possible due time, as an owner sleeping on NextDue does
		if next, ok := w.NextDue(); ok && next > now {
			return next
		}
		return now + int64(w.Resolution())
	case 5: // a large jump: a node that slept
		return now + s.upTo(int64(48*time.Hour))
	case 6: // a jump of years
		return now + s.upTo(15*year)
	default: // backwards: must change nothing
		return now - s.upTo(int64(time.Minute))
	}
}

// checkAdvance advances the wheel and compares what came out with the model:
// never early, complete, sorted, each entry once.
func checkAdvance(t *testing.T, step int, w *Wheel, m *model, now int64, max int, out []Entry) []Entry {
	t.Helper()
	before := w.Now()
	out = w.Advance(now, out, max)
	if !slices.IsSortedFunc(out, byDue) {
		t.Fatalf("step %d: Advance returned entries out of due order", step)
	}
	got := make(map[uint64]int64, len(out))
	for _, e := range out {
		if _, dup := got[e.Ref]; dup {
			t.Fatalf("step %d: ref %d returned twice in one Advance", step, e.Ref)
		}
		got[e.Ref] = e.Due
	}
	target := m.floorTick(now)
	var maxTick uint64
	for i := range m.entries {
		me := &m.entries[i]
		due, returned := got[me.ref]
		if returned {
			if !me.alive {
				t.Fatalf("step %d: ref %d returned but was removed or returned before", step, me.ref)
			}
			if due != me.due {
				t.Fatalf("step %d: ref %d returned with due %d, added with %d", step, me.ref, due, me.due)
			}
			if !me.ready && m.floorTick(now) < m.floorTick(before) {
				t.Fatalf("step %d: Advance to %d, before the wheel's time %d, returned ref %d, which no Ready found due", step, now, before, me.ref)
			}
			if me.due > now && !me.ready {
				t.Fatalf("step %d: ref %d returned early: due %d, now %d", step, me.ref, me.due, now)
			}
			if !me.ready {
				maxTick = max64(maxTick, m.ceilTick(me.due))
			}
			me.alive, me.ready = false, false
		}
	}
	complete := max <= 0 || len(out) < max
	if !complete {
		// The limit is checked after each tick's entries: without the last
		// tick's entries, out must be below the limit. Entries overdue when
		// Advance began form one batch at the wheel's starting tick.
		unit := func(e Entry) uint64 { return max64(m.ceilTick(e.Due), m.floorTick(before)) }
		last, earlier := unit(out[len(out)-1]), 0
		for _, e := range out {
			if unit(e) < last {
				earlier++
			}
		}
		if earlier >= max {
			t.Fatalf("step %d: Advance with max %d returned %d entries; it should have stopped after %d", step, max, len(out), earlier)
		}
	}
	for _, me := range m.entries {
		if !me.alive {
			continue
		}
		tick := m.ceilTick(me.due)
		if complete && tick <= target && m.floorTick(now) >= m.floorTick(before) {
			t.Fatalf("step %d: ref %d (due %d, tick %d) is due at now %d (tick %d) but was not returned", step, me.ref, me.due, tick, now, target)
		}
		if !complete && tick < maxTick {
			t.Fatalf("step %d: limited Advance returned tick %d but left ref %d of earlier tick %d", step, maxTick, me.ref, tick)
		}
	}
	if w.Now() > now && m.floorTick(now) >= m.floorTick(before) {
		t.Fatalf("step %d: wheel time %d ran past now %d", step, w.Now(), now)
	}
	return out
}

// checkReady calls Ready and compares what came out with the model: never
// early, each entry once and with its due time and priority, as many as
// are due up to max, and highest priority first: no entry left due has a
// higher priority than one returned, and the returned ones are in
// non-increasing priority.
func checkReady(t *testing.T, step int, w *Wheel, m *model, now int64, limit int, out []Entry) []Entry {
	t.Helper()
	before := w.Now()
	out = w.Ready(now, out, limit)
	target := m.floorTick(now)
	got := make(map[uint64]Entry, len(out))
	for i, e := range out {
		if _, dup := got[e.Ref]; dup {
			t.Fatalf("step %d: ref %d returned twice in one Ready", step, e.Ref)
		}
		got[e.Ref] = e
		if i > 0 && e.Priority > out[i-1].Priority {
			t.Fatalf("step %d: Ready returned priority %d after %d", step, e.Priority, out[i-1].Priority)
		}
	}
	lowest := uint8(MaxPriority)
	for _, e := range out {
		lowest = min(lowest, e.Priority)
	}
	due := 0
	for i := range m.entries {
		me := &m.entries[i]
		if !me.alive {
			if _, ok := got[me.ref]; ok {
				t.Fatalf("step %d: ref %d returned but was removed or returned before", step, me.ref)
			}
			continue
		}
		isDue := me.ready || m.ceilTick(me.due) <= target
		if e, ok := got[me.ref]; ok {
			if !isDue {
				t.Fatalf("step %d: ref %d returned early: due %d, now %d", step, me.ref, me.due, now)
			}
			if e.Due != me.due || e.Priority != me.prio {
				t.Fatalf("step %d: ref %d returned as due %d priority %d, added as %d, %d", step, me.ref, e.Due, e.Priority, me.due, me.prio)
			}
			me.alive, me.ready = false, false
			due++
			continue
		}
		if isDue {
			due++
			me.ready = true
			if len(out) > 0 && me.prio > lowest {
				t.Fatalf("step %d: Ready left ref %d of priority %d and returned one of %d", step, me.ref, me.prio, lowest)
			}
		}
	}
	if want := due; limit > 0 && want > limit {
		if len(out) != limit {
			t.Fatalf("step %d: Ready(max %d) returned %d of %d due", step, limit, len(out), due)
		}
	} else if len(out) != want {
		t.Fatalf("step %d: Ready returned %d entries, %d were due", step, len(out), want)
	}
	if after := int64(target) * m.res; target <= uint64(math.MaxInt64/m.res) && w.Now() != max(before, after) {
		t.Fatalf("step %d: Ready to %d left the wheel's time at %d (it was %d)", step, now, w.Now(), before)
	}
	return out
}

func max64(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// checkNextDue verifies NextDue is a lower bound of the earliest pending due
// time and that an owner sleeping on it reaches that entry in a bounded number
// of wake-ups (one per level at most, plus the final one).
func checkNextDue(t *testing.T, step int, w *Wheel, m *model) {
	t.Helper()
	next, ok := w.NextDue()
	if ok != (m.alive() > 0) {
		t.Fatalf("step %d: NextDue ok=%v with %d pending", step, ok, m.alive())
	}
	if !ok {
		return
	}
	earliest := uint64(math.MaxUint64)
	for _, me := range m.entries {
		if me.alive {
			earliest = min(earliest, m.ceilTick(me.due))
		}
	}
	bound := earliest * uint64(m.res)
	if earliest > uint64(math.MaxInt64)/uint64(m.res) {
		bound = math.MaxInt64
	}
	// An entry already overdue is due at the wheel's current time.
	bound = max(bound, uint64(w.Now()))
	if next > int64(bound) {
		t.Fatalf("step %d: NextDue %d is after the earliest entry's due tick %d", step, next, bound)
	}
}

func TestModelRandomPrograms(t *testing.T) {
	programs := 400
	if testing.Short() {
		programs = 50
	}
	for seed := range programs {
		r := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
		data := make([]byte, 200+r.IntN(6000))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runProgram(t, data) })
	}
}

func FuzzWheel(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 1, 8, 3, 11})
	for seed := range 8 {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		data := make([]byte, 512)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) { runProgram(t, data) })
}

func byDue(a, b Entry) int { return cmp.Compare(a.Due, b.Due) }

func TestSortByDue(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{0, 1, 2, 15, 16, 17, 100, 1000, 5000} {
		for _, spread := range []int64{1, 3, 1 << 40} { // many ties, some, none
			es := make([]Entry, n)
			for i := range es {
				es[i] = Entry{Ref: uint64(i), Due: r.Int64N(spread)}
			}
			want := slices.Clone(es)
			slices.SortStableFunc(want, byDue)
			sortByDue(es)
			if !slices.IsSortedFunc(es, byDue) {
				t.Fatalf("n=%d spread=%d: not sorted", n, spread)
			}
			slices.SortStableFunc(es, func(a, b Entry) int { return cmp.Or(byDue(a, b), cmp.Compare(a.Ref, b.Ref)) })
			slices.SortStableFunc(want, func(a, b Entry) int { return cmp.Or(byDue(a, b), cmp.Compare(a.Ref, b.Ref)) })
			if !slices.Equal(es, want) {
				t.Fatalf("n=%d spread=%d: entries lost or duplicated", n, spread)
			}
		}
	}
}
