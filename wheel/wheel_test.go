package wheel

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC).UnixNano()

func mustNew(t testing.TB, now int64, res time.Duration) *Wheel {
	t.Helper()
	w, err := New(now, res)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func refs(es []Entry) []uint64 {
	r := make([]uint64, len(es))
	for i, e := range es {
		r[i] = e.Ref
	}
	return r
}

func TestNewRejectsNonPositiveResolution(t *testing.T) {
	for _, res := range []time.Duration{0, -time.Millisecond} {
		if _, err := New(t0, res); err == nil {
			t.Errorf("New(_, %v) succeeded", res)
		}
	}
}

func TestNeverEarlyAtMostOneTickLate(t *testing.T) {
	w := mustNew(t, t0, time.Millisecond)
	w.Add(1, t0+1_500_000, 0) // 1.5 ms: belongs to the 2 ms boundary
	w.Add(2, t0+2_000_000, 0) // exactly on a boundary
	if got := w.Advance(t0+1_999_999, nil, 0); len(got) != 0 {
		t.Fatalf("returned %v before the 2 ms boundary", got)
	}
	got := w.Advance(t0+2_000_000, nil, 0)
	if fmt.Sprint(refs(got)) != "[1 2]" {
		t.Fatalf("at 2 ms got %v, want refs [1 2]", got)
	}
}

func TestPastAndCurrentTickAreDueAtNextAdvance(t *testing.T) {
	w := mustNew(t, t0, time.Millisecond)
	w.Advance(t0+10_000_000, nil, 0)
	w.Add(1, t0, 0)            // well in the past
	w.Add(2, t0+9_999_999, 0)  // late in the previous tick
	w.Add(3, t0+10_000_000, 0) // exactly now
	w.Add(4, -5, 0)            // before 1970
	w.Add(5, t0+10_000_001, 0) // in the current tick: not due yet
	got := w.Advance(t0+10_000_000, nil, 0)
	if fmt.Sprint(refs(got)) != "[4 1 2 3]" {
		t.Fatalf("got %v, want refs [4 1 2 3] in due order", refs(got))
	}
	if w.Len() != 1 {
		t.Fatalf("Len() = %d, want 1", w.Len())
	}
}

func TestRemove(t *testing.T) {
	w := mustNew(t, t0, time.Millisecond)
	a := w.Add(1, t0+5_000_000, 0)
	b := w.Add(2, t0+5_000_000, 0)
	if !w.Remove(a) {
		t.Fatal("Remove of a pending entry reported false")
	}
	if w.Remove(a) {
		t.Fatal("second Remove of the same handle reported true")
	}
	got := w.Advance(t0+time.Hour.Nanoseconds(), nil, 0)
	if fmt.Sprint(refs(got)) != "[2]" {
		t.Fatalf("got %v, want [2]", refs(got))
	}
	if w.Remove(b) {
		t.Fatal("Remove after the entry was returned reported true")
	}
	// The freed slot is reused; the old handle must not reach the new entry.
	c := w.Add(3, t0+2*time.Hour.Nanoseconds(), 0)
	if w.Remove(a) || w.Remove(b) {
		t.Fatal("a stale handle removed a reused slot")
	}
	if !w.Remove(c) || w.Len() != 0 {
		t.Fatalf("Remove(c) failed or Len() = %d", w.Len())
	}
	if w.Remove(0) {
		t.Fatal("the zero Handle removed something")
	}
}

// TestYearsAheadAtNanosecondResolution covers ten years at 1 ns: 3e17 ticks,
// so a wheel that walked empty slots would never finish.
func TestYearsAheadAtNanosecondResolution(t *testing.T) {
	w := mustNew(t, t0, time.Nanosecond)
	tenYears := 10 * 365 * 24 * time.Hour.Nanoseconds()
	for i := range 100 {
		w.Add(uint64(i), t0+tenYears-int64(i)*int64(time.Hour), 0)
	}
	wakeups, fired := 0, 0
	now := t0
	for w.Len() > 0 {
		next, _ := w.NextDue()
		now = max(now, next)
		got := w.Advance(now, nil, 0)
		for _, e := range got {
			if e.Due > now {
				t.Fatalf("ref %d early: due %d, now %d", e.Ref, e.Due, now)
			}
		}
		fired += len(got)
		wakeups++
	}
	if fired != 100 {
		t.Fatalf("fired %d, want 100", fired)
	}
	// Each entry costs at most one wake-up per level plus its own.
	if wakeups > 100*(numLevels+1) {
		t.Fatalf("%d wake-ups for 100 entries", wakeups)
	}
}

func TestAdvanceLimit(t *testing.T) {
	w := mustNew(t, t0, time.Millisecond)
	for i := range 10 {
		w.Add(uint64(i), t0+int64(i/2+1)*1_000_000, 0) // two entries per tick
	}
	got := w.Advance(t0+time.Second.Nanoseconds(), nil, 3)
	if fmt.Sprint(refs(got)) != "[0 1 2 3]" {
		t.Fatalf("limited Advance got %v, want the first two ticks [0 1 2 3]", refs(got))
	}
	if next, _ := w.NextDue(); next > t0+time.Second.Nanoseconds() {
		t.Fatalf("NextDue %d after a limited Advance should be at or before now", next)
	}
	got = w.Advance(t0+time.Second.Nanoseconds(), got[:0], 0)
	if fmt.Sprint(refs(got)) != "[4 5 6 7 8 9]" {
		t.Fatalf("second Advance got %v", refs(got))
	}
}

func TestTimeDoesNotGoBackwards(t *testing.T) {
	w := mustNew(t, t0, time.Millisecond)
	w.Advance(t0+time.Minute.Nanoseconds(), nil, 0)
	w.Add(1, t0, 0)
	if got := w.Advance(t0, nil, 0); len(got) != 0 {
		t.Fatalf("Advance to an earlier time returned %v", got)
	}
	if w.Now() != t0+time.Minute.Nanoseconds() {
		t.Fatalf("Now() = %d moved backwards", w.Now())
	}
}

func ExampleWheel() {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w, _ := New(start.UnixNano(), time.Millisecond)
	w.Add(7, start.Add(250*time.Millisecond).UnixNano(), 0)
	cancel := w.Add(8, start.Add(100*time.Millisecond).UnixNano(), 0)
	w.Add(9, start.Add(time.Hour).UnixNano(), 0)
	w.Remove(cancel)

	// The owner sleeps until NextDue, then advances with its clock. NextDue
	// is a lower bound, so a wake-up may return nothing: sleep again.
	var due []Entry
	for len(due) == 0 {
		next, _ := w.NextDue()
		due = w.Advance(next, due, 0)
	}
	for _, e := range due {
		fmt.Println("due:", e.Ref, time.Unix(0, e.Due).Sub(start))
	}
	fmt.Println("pending:", w.Len())
	// Output:
	// due: 7 250ms
	// pending: 1
}
