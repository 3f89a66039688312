package raftfsm

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// dueMinute is the resolution of the due counts: a forecast's ranges start and step on whole
// minutes of Unix time.
const dueMinute = int64(time.Minute)

const dueHourNs = 60 * dueMinute

// dueCounts counts pending events by the minute of Unix time their due time falls in, in
// pages of an hour, each held only while one of its minutes counts an event. It is what
// answers a forecast without reading the due index: Count over a due range walks every
// due-index key in it, and a forecast of a month of minutes, hours and days walks every
// pending event due in the month up to three times (ten million in well over a second).
//
// A page is 256 bytes, one per hour that holds a pending event's due time: at most 87,600
// for the ten years ahead an event may be due in (rpc's MaxHorizon), 22 MB, and 180 KB for
// pending events spread over a month. A minute counts at most 2^32-1 events, which a shard
// cannot hold (that many bodies in one shard is hundreds of gigabytes).
type dueCounts struct {
	hours map[int64]*dueHour // by floor(due / hour)
}

type dueHour struct {
	minutes [60]uint32
	n       uint64 // the sum of minutes
}

// splitDue returns the hour of Unix time due falls in (rounded down, also before 1970) and
// its minute within that hour.
func splitDue(due int64) (hour int64, minute int) {
	hour = due / dueHourNs
	rem := due % dueHourNs
	if rem < 0 {
		hour--
		rem += dueHourNs
	}
	return hour, int(rem / dueMinute)
}

// add adds delta events due in the minute of due.
func (d *dueCounts) add(due int64, delta int64) {
	h, m := splitDue(due)
	d.addMinute(h, m, delta)
}

func (d *dueCounts) addMinute(h int64, m int, delta int64) {
	if d.hours == nil {
		d.hours = make(map[int64]*dueHour)
	}
	pg := d.hours[h]
	if pg == nil {
		pg = new(dueHour)
		d.hours[h] = pg
	}
	pg.minutes[m] += uint32(delta) // two's complement: a negative delta subtracts
	pg.n += uint64(delta)
	if pg.n == 0 {
		delete(d.hours, h)
	}
}

// total returns how many events d counts.
func (d *dueCounts) total() (n uint64) {
	for _, pg := range d.hours {
		n += pg.n
	}
	return n
}

// dueDelta is a change of the due counts an apply made: delta events in minute (of Unix
// time). Consecutive changes in one minute, as a batch of events due together makes, are one.
type dueDelta struct {
	minute int64
	delta  int64
}

// noteDue records that an apply added (delta 1) or removed (-1) a pending event due at due,
// to be taken into the FSM's due counts once its batch commits (takeDueDeltas).
func noteDue(ds []dueDelta, due int64, delta int64) []dueDelta {
	h, m := splitDue(due)
	minute := h*60 + int64(m)
	if n := len(ds); n > 0 && ds[n-1].minute == minute {
		ds[n-1].delta += delta
		return ds
	}
	return append(ds, dueDelta{minute: minute, delta: delta})
}

// takeDueDeltas applies the changes of a committed batch to the due counts. Called on the
// apply goroutine with f.mu held for writing.
func (f *FSM) takeDueDeltas() {
	m := &f.pending
	for _, d := range m.deltas {
		if d.delta != 0 {
			h, mm := d.minute/60, int(d.minute%60)
			if mm < 0 {
				h, mm = h-1, mm+60
			}
			f.dues.addMinute(h, mm, d.delta)
		}
	}
	m.deltas = m.deltas[:0]
}

// DueSeries is Count consecutive ranges of due time, each Step long, the first starting at
// Start (Unix ns). Start and Step are whole minutes.
type DueSeries struct {
	Start, Step int64
	Count       int
}

// end returns where the series' last range ends.
func (s DueSeries) end() int64 { return s.Start + int64(s.Count)*s.Step }

// ErrForecastRange is a forecast series that is not whole minutes, or too long.
var ErrForecastRange = errors.New("raftfsm: forecast series must start and step on whole minutes of Unix time, with 1 to MaxForecastBuckets ranges")

// MaxForecastBuckets bounds the ranges of one series.
const MaxForecastBuckets = 10_000

func (s DueSeries) check() error {
	switch {
	case s.Step <= 0 || s.Step%dueMinute != 0 || s.Start%dueMinute != 0,
		s.Count < 1 || s.Count > MaxForecastBuckets,
		s.Step > math.MaxInt64/int64(s.Count),
		s.Start > 0 && s.Start > math.MaxInt64-int64(s.Count)*s.Step:
		return fmt.Errorf("%w: start %d, step %d, %d ranges", ErrForecastRange, s.Start, s.Step, s.Count)
	}
	return nil
}

// Forecast is how many of a shard's pending events fall due in each range of the series a
// forecast asked for.
type Forecast struct {
	// Counts holds one slice per series asked for, one count per range.
	Counts [][]uint64
	// Before is the pending events due before the first series' start: overdue, when that
	// start is now.
	Before uint64
	// Pending is every pending event.
	Pending uint64
	// Earliest and Latest are the due times of the first and the last pending event, read
	// from the due index a moment after the counts; both are zero when none is pending.
	Earliest, Latest int64
}

// Forecast counts the pending events due in each range of series. Once the pending set is
// loaded (see pendingMirror) it reads the in-memory due counts, a page per hour a range
// covers, never the due index; until then it walks the due index over the series' ranges,
// with the same result. The counts, Before and Pending are of one committed state.
func (f *FSM) Forecast(series []DueSeries) (Forecast, error) {
	for _, s := range series {
		if err := s.check(); err != nil {
			return Forecast{}, err
		}
	}
	f.tryTakePending()
	fc, ok := f.forecastCounted(series)
	if !ok {
		var err error
		if fc, err = f.forecastWalk(series); err != nil {
			return Forecast{}, err
		}
	}
	if fc.Pending > 0 {
		var err error
		if fc.Earliest, fc.Latest, err = f.dueBounds(); err != nil {
			return Forecast{}, err
		}
	}
	return fc, nil
}

// forecastCounted answers from the due counts, or reports false while they are not loaded.
func (f *FSM) forecastCounted(series []DueSeries) (Forecast, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !f.duesLoaded {
		return Forecast{}, false
	}
	fc := Forecast{Counts: make([][]uint64, len(series)), Pending: f.meta.pending}
	for i, s := range series {
		fc.Counts[i] = make([]uint64, s.Count)
		f.dues.series(s, fc.Counts[i])
	}
	if len(series) > 0 {
		startHour, startMinute := splitDue(series[0].Start)
		for h, pg := range f.dues.hours {
			switch {
			case h < startHour:
				fc.Before += pg.n
			case h == startHour:
				for _, n := range pg.minutes[:startMinute] {
					fc.Before += uint64(n)
				}
			}
		}
	}
	return fc, true
}

// minuteStart returns where minute m of hour h starts (Unix ns). The first minute that
// holds a due time, in 1677, starts before the least int64: it is given as that, which is
// no whole minute and so starts no forecast range, as none of its events can.
func minuteStart(h int64, m int) int64 {
	if h < math.MinInt64/dueHourNs {
		next, back := (h+1)*dueHourNs, int64(60-m)*dueMinute
		if uint64(next-math.MinInt64) < uint64(back) {
			return math.MinInt64
		}
		return next - back
	}
	return h*dueHourNs + int64(m)*dueMinute
}

// series adds the events due in each range of s to out. It looks up the pages of the hours
// the series covers, or goes through every page when there are fewer of them.
func (d *dueCounts) series(s DueSeries, out []uint64) {
	from, to := s.Start, s.end()
	firstHour, _ := splitDue(from)
	lastHour, _ := splitDue(to - 1)
	addPage := func(h int64, pg *dueHour) {
		for m, n := range pg.minutes {
			if n == 0 {
				continue
			}
			if at := minuteStart(h, m); at >= from && at < to {
				out[(at-from)/s.Step] += uint64(n)
			}
		}
	}
	if span := lastHour - firstHour + 1; span > 0 && span <= int64(len(d.hours)) {
		for h := firstHour; h <= lastHour; h++ {
			if pg := d.hours[h]; pg != nil {
				addPage(h, pg)
			}
		}
		return
	}
	for h, pg := range d.hours {
		if h >= firstHour && h <= lastHour {
			addPage(h, pg)
		}
	}
}

// forecastWalk answers by walking the due index over the series' ranges (and, for Before,
// from its start), from one consistent view.
func (f *FSM) forecastWalk(series []DueSeries) (fc Forecast, err error) {
	it, err := f.newIter(appendShardTag(nil, f.shard, tagDue), appendShardTag(nil, f.shard, tagDue+1))
	if err != nil {
		return Forecast{}, err
	}
	defer closeIter(it, &err)
	fc = Forecast{Counts: make([][]uint64, len(series)), Pending: f.Stats().Pending}
	count := func(from, to int64, each func(due int64)) error {
		for valid := it.SeekGE(appendDueKey(nil, f.shard, from, 0)); valid; valid = it.Next() {
			due, _, err := parseDueKey(it.Key())
			if err != nil {
				return err
			}
			if due >= to {
				break
			}
			each(due)
		}
		return it.Error()
	}
	for i, s := range series {
		out := make([]uint64, s.Count)
		if err := count(s.Start, s.end(), func(due int64) { out[(due-s.Start)/s.Step]++ }); err != nil {
			return Forecast{}, err
		}
		fc.Counts[i] = out
	}
	if len(series) > 0 {
		if err := count(minDue, series[0].Start, func(int64) { fc.Before++ }); err != nil {
			return Forecast{}, err
		}
	}
	return fc, nil
}

// dueBounds returns the due times of the first and the last key of the due index.
func (f *FSM) dueBounds() (first, last int64, err error) {
	it, err := f.newIter(appendShardTag(nil, f.shard, tagDue), appendShardTag(nil, f.shard, tagDue+1))
	if err != nil {
		return 0, 0, err
	}
	defer closeIter(it, &err)
	if !it.First() {
		return 0, 0, it.Error()
	}
	if first, _, err = parseDueKey(it.Key()); err != nil {
		return 0, 0, err
	}
	if !it.Last() {
		return 0, 0, it.Error()
	}
	last, _, err = parseDueKey(it.Key())
	return first, last, err
}
