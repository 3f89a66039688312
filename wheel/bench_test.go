package wheel

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// The benchmarks put the wheel side by side with the Go runtime's timers
// (time.AfterFunc with one shared callback), each holding 1M or 10M other
// pending entries due an hour or more ahead:
//
//   - ScheduleFire: add an entry due within the next millisecond and let it
//     fire. For the wheel, firing is an Advance of its owner's clock (1 µs of
//     virtual time per operation); for AfterFunc, the runtime fires the
//     callback in its own goroutine and the run waits for every callback.
//   - ScheduleCancel: add an entry and remove it again.
//
// B/pending is the heap growth per pending entry while the pending set was
// built (runtime.MemStats.HeapAlloc after a GC, before and after), not
// counting the caller's slice of handles.
//
//	go test -run '^$' -bench . -benchmem ./wheel/

var pendingSizes = []int{1_000_000, 10_000_000}

func BenchmarkScheduleFire(b *testing.B) {
	for _, n := range pendingSizes {
		withPendingWheel(b, n, func(w *Wheel, perEntry float64) {
			b.Run("wheel/pending="+count(n), func(b *testing.B) {
				wheelScheduleFire(b, w)
				b.ReportMetric(perEntry, "B/pending")
			})
		})
		withPendingTimers(b, n, func(perEntry float64) {
			b.Run("afterfunc/pending="+count(n), func(b *testing.B) {
				afterFuncScheduleFire(b)
				b.ReportMetric(perEntry, "B/pending")
			})
		})
	}
}

func BenchmarkScheduleCancel(b *testing.B) {
	for _, n := range pendingSizes {
		withPendingWheel(b, n, func(w *Wheel, perEntry float64) {
			b.Run("wheel/pending="+count(n), func(b *testing.B) {
				b.ReportMetric(perEntry, "B/pending")
				rng := xorshift(1)
				now := w.Now()
				for i := 0; i < b.N; i++ {
					h := w.Add(uint64(i), now+int64(rng.next()%uint64(time.Hour)), 0)
					w.Remove(h)
				}
			})
		})
		withPendingTimers(b, n, func(perEntry float64) {
			b.Run("afterfunc/pending="+count(n), func(b *testing.B) {
				b.ReportMetric(perEntry, "B/pending")
				rng := xorshift(1)
				f := func() {}
				for i := 0; i < b.N; i++ {
					t := time.AfterFunc(time.Duration(rng.next()%uint64(time.Hour)), f)
					t.Stop()
				}
			})
		})
	}
}

// BenchmarkAdvanceIdle advances a wheel holding 1M entries due two centuries
// ahead by ten seconds of empty time per operation, as an owner that slept
// would: the cost must not grow with the 10,000 empty 1 ms slots skipped each
// time. (10^8 operations cover 32 years, far short of the entries.)
func BenchmarkAdvanceIdle(b *testing.B) {
	start := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC).UnixNano()
	w, _ := New(start, DefaultResolution)
	rng := xorshift(4)
	for i := range 1_000_000 {
		w.Add(uint64(i), start+200*year+int64(rng.next()%uint64(30*year)), 0)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if out := w.Advance(w.Now()+10*time.Second.Nanoseconds(), nil, 0); len(out) != 0 {
			b.Fatalf("%d entries fell due", len(out))
		}
	}
}

func wheelScheduleFire(b *testing.B, w *Wheel) {
	rng := xorshift(2)
	now := w.Now()
	var out []Entry
	fired := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.Add(uint64(i), now+int64(rng.next()%uint64(time.Millisecond)), 0)
		now += int64(time.Microsecond)
		out = w.Advance(now, out[:0], 0)
		fired += len(out)
	}
	out = w.Advance(now+int64(2*time.Millisecond), out[:0], 0)
	fired += len(out)
	b.StopTimer()
	if fired != b.N {
		b.Fatalf("fired %d of %d", fired, b.N)
	}
}

func afterFuncScheduleFire(b *testing.B) {
	rng := xorshift(2)
	var fired atomic.Int64
	done := make(chan struct{})
	target := int64(b.N)
	f := func() {
		if fired.Add(1) == target {
			close(done)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		time.AfterFunc(time.Duration(rng.next()%uint64(time.Millisecond)), f)
	}
	<-done
}

// withPendingWheel builds a wheel holding n entries due one to two hours
// ahead, measures their memory, and hands it to fn.
func withPendingWheel(b *testing.B, n int, fn func(w *Wheel, bytesPerEntry float64)) {
	start := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC).UnixNano()
	rng := xorshift(3)
	before := heapAfterGC()
	w, _ := New(start, DefaultResolution)
	for i := range n {
		w.Add(uint64(i), start+int64(time.Hour)+int64(rng.next()%uint64(time.Hour)), 0)
	}
	perEntry := float64(heapAfterGC()-before) / float64(n)
	fn(w, perEntry)
	runtime.KeepAlive(w)
}

// withPendingTimers starts n runtime timers due one to two hours ahead,
// measures their memory, runs fn, and stops them.
func withPendingTimers(b *testing.B, n int, fn func(bytesPerEntry float64)) {
	timers := make([]*time.Timer, n) // allocated before the measurement
	rng := xorshift(3)
	f := func() {}
	before := heapAfterGC()
	for i := range timers {
		timers[i] = time.AfterFunc(time.Hour+time.Duration(rng.next()%uint64(time.Hour)), f)
	}
	perEntry := float64(heapAfterGC()-before) / float64(n)
	fn(perEntry)
	for _, t := range timers {
		t.Stop()
	}
}

func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func count(n int) string {
	if n%1_000_000 == 0 {
		return fmt.Sprintf("%dM", n/1_000_000)
	}
	return fmt.Sprint(n)
}

// xorshift is a tiny deterministic generator, cheap enough not to show up in
// the measurements.
type xorshift uint64

func (x *xorshift) next() uint64 {
	v := uint64(*x)
	if v == 0 {
		v = 0x9e3779b97f4a7c15
	}
	v ^= v << 13
	v ^= v >> 7
	v ^= v << 17
	*x = xorshift(v)
	return v
}
