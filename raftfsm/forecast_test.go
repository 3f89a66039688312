package raftfsm

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"
)

func TestSplitDue(t *testing.T) {
	for _, tc := range []struct {
		due    int64
		hour   int64
		minute int
	}{
		{0, 0, 0},
		{int64(59*time.Minute + 59*time.Second), 0, 59},
		{int64(time.Hour), 1, 0},
		{-1, -1, 59},
		{-int64(time.Hour), -1, 0},
		{-int64(time.Hour) - 1, -2, 59},
		{int64(25*time.Hour + 7*time.Minute + 3), 25, 7},
		{math.MaxInt64, 2562047, 47},
		{math.MinInt64, -2562048, 12},
	} {
		h, m := splitDue(tc.due)
		if h != tc.hour || m != tc.minute {
			t.Errorf("splitDue(%d) = %d, %d; want %d, %d", tc.due, h, m, tc.hour, tc.minute)
		}
		if start := minuteStart(h, m); start > tc.due || tc.due-start >= dueMinute && start != math.MinInt64 {
			t.Errorf("minuteStart(%d, %d) = %d: not the start of the minute of %d", h, m, start, tc.due)
		}
	}
	if got := minuteStart(-2562048, 0); got != math.MinInt64 {
		t.Errorf("the minute before the least int64 starts at %d", got)
	}
}

// TestDueCountsPages: pages come and go with their counts, and a series sums exactly the
// minutes inside it, whether it looks its hours up or goes through every page.
func TestDueCountsPages(t *testing.T) {
	var d dueCounts
	at := func(h, m int) int64 { return int64(h)*dueHourNs + int64(m)*dueMinute + 17 }
	d.add(at(10, 0), 1)
	d.add(at(10, 59), 2)
	d.add(at(11, 30), 3)
	d.add(at(-1, 59), 4) // the minute before 1970
	d.add(at(500, 0), 5)
	if len(d.hours) != 4 || d.total() != 15 {
		t.Fatalf("%d pages, %d events", len(d.hours), d.total())
	}
	d.add(at(500, 0), -5)
	if len(d.hours) != 3 || d.hours[500] != nil {
		t.Fatalf("an emptied page is kept: %d pages", len(d.hours))
	}
	for _, tc := range []struct {
		s    DueSeries
		want []uint64
	}{
		{DueSeries{Start: at(10, 0) - 17, Step: dueMinute, Count: 3}, []uint64{1, 0, 0}},
		{DueSeries{Start: at(10, 58) - 17, Step: dueMinute, Count: 3}, []uint64{0, 2, 0}},
		{DueSeries{Start: at(9, 0) - 17, Step: dueHourNs, Count: 3}, []uint64{0, 3, 3}},
		{DueSeries{Start: -dueHourNs, Step: dueHourNs, Count: 2}, []uint64{4, 0}},
		// More hours than pages: every page is gone through instead.
		{DueSeries{Start: -dueHourNs, Step: 24 * dueHourNs, Count: 400}, append([]uint64{10}, make([]uint64, 399)...)},
		{DueSeries{Start: at(10, 30) - 17, Step: 30 * dueMinute, Count: 2}, []uint64{2, 0}},
	} {
		got := make([]uint64, tc.s.Count)
		d.series(tc.s, got)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("series %+v = %v, want %v", tc.s, got, tc.want)
		}
	}
}

func TestForecastRefusesBadSeries(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 1)
	defer f.Close()
	for _, s := range []DueSeries{
		{Start: 1, Step: dueMinute, Count: 1},
		{Start: 0, Step: dueMinute + 1, Count: 1},
		{Start: 0, Step: 0, Count: 1},
		{Start: 0, Step: dueMinute, Count: 0},
		{Start: 0, Step: dueMinute, Count: MaxForecastBuckets + 1},
		{Start: math.MaxInt64 / dueMinute * dueMinute, Step: dueMinute, Count: 2},
	} {
		if _, err := f.Forecast([]DueSeries{s}); !errors.Is(err, ErrForecastRange) {
			t.Errorf("Forecast(%+v): %v", s, err)
		}
	}
}

// checkForecast compares a forecast of the shard with the model's pending events, for
// series around the leader's clock and before 1970, where the generator puts due times;
// and, when the due counts are loaded, the answer from them with a walk of the due index.
func (h *harness) checkForecast() {
	t, f, m := h.t, h.f, h.m
	t.Helper()
	minute := func(ns int64) int64 {
		hr, mm := splitDue(ns)
		return minuteStart(hr, mm)
	}
	series := []DueSeries{
		{Start: minute(h.g.now) - 10*dueMinute, Step: dueMinute, Count: 40},
		{Start: minute(h.g.now) - 60*dueMinute, Step: 5 * dueMinute, Count: 30},
		{Start: -20 * dueMinute, Step: dueMinute, Count: 25},
		{Start: minute(h.g.now) - 24*dueHourNs, Step: 24 * dueHourNs, Count: 3},
	}
	want := Forecast{Counts: make([][]uint64, len(series)), Earliest: math.MaxInt64, Latest: math.MinInt64}
	for i, s := range series {
		want.Counts[i] = make([]uint64, s.Count)
	}
	for _, seq := range m.pendingSeqs() {
		due := m.bySeq[seq].Due
		want.Pending++
		want.Earliest, want.Latest = min(want.Earliest, due), max(want.Latest, due)
		if due < series[0].Start {
			want.Before++
		}
		for i, s := range series {
			if due >= s.Start && due < s.end() {
				want.Counts[i][(due-s.Start)/s.Step]++
			}
		}
	}
	if want.Pending == 0 {
		want.Earliest, want.Latest = 0, 0
	}
	got, err := f.Forecast(series)
	if err != nil {
		t.Fatalf("Forecast: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Forecast (due counts loaded: %v):\n got %+v\nwant %+v", f.duesLoaded, got, want)
	}
	if counted, ok := f.forecastCounted(series); ok {
		walked, err := f.forecastWalk(series)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(counted, walked) {
			t.Fatalf("due counts %+v, due index %+v", counted, walked)
		}
		h.countedChecks++
	}
}

// wantDueCounts fails unless f's due counts, once loaded, equal those of its due index.
func wantDueCounts(t testing.TB, f *FSM) {
	t.Helper()
	var want dueCounts
	if err := f.ForEachPending(func(_ uint64, due int64, _ Policy) error {
		want.add(due, 1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !f.duesLoaded {
		t.Fatal("due counts not loaded with the pending set")
	}
	if len(want.hours) == 0 && len(f.dues.hours) == 0 {
		return
	}
	if !reflect.DeepEqual(f.dues.hours, want.hours) {
		t.Fatalf("due counts hold %d events in %d hours, the due index %d in %d", f.dues.total(), len(f.dues.hours), want.total(), len(want.hours))
	}
}

// TestForecastOfAnIdleShard: after a reopen, a shard that applies nothing
// still answers from its due counts once their build is done (a forecast
// takes it in), with what the walk of the due index gives.
func TestForecastOfAnIdleShard(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 4)
	const start = int64(1_899_999_960) * 1e9
	c := &ScheduleBatch{ProposedAt: start}
	for i := range 50 {
		c.Events = append(c.Events, NewEvent{ID: fmt.Sprintf("e-%d", i), Topic: "t", Due: start + int64(i)*int64(7*time.Minute), ContentHash: uint64(i), Policy: DefaultPolicy})
	}
	f.Apply(cmdLog(1, c))
	f.Close()
	f, _ = newTestFSM(t, st, 4)
	defer f.Close()
	if err := f.LoadPending(maxDue, nil); err != nil {
		t.Fatal(err)
	}
	<-f.pending.build.done
	series := []DueSeries{{Start: start, Step: dueHourNs, Count: 6}}
	walked, err := f.forecastWalk(series)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.Forecast(series)
	if err != nil {
		t.Fatal(err)
	}
	walked.Earliest, walked.Latest = start, start+49*int64(7*time.Minute)
	if !f.duesLoaded || !reflect.DeepEqual(got, walked) {
		t.Fatalf("loaded %v: %+v, want %+v", f.duesLoaded, got, walked)
	}
	if want := []uint64{9, 9, 8, 9, 8, 7}; !reflect.DeepEqual(got.Counts[0], want) {
		t.Errorf("per hour %v, want %v", got.Counts[0], want)
	}
}
