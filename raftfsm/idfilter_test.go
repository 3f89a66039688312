package raftfsm

import (
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestIDFilterHasNoFalseNegatives: every id added is "maybe" in every later generation mix,
// and ids never added are mostly "certainly new".
func TestIDFilterHasNoFalseNegatives(t *testing.T) {
	idf := &idFilter{seed: maphash.MakeSeed(), gens: []*bloomGen{newBloomGen(1000)}, minIDs: minFilterIDs}
	idf.ready.Store(true)
	const n = 200_000
	for i := range n {
		idf.add("event-"+strconv.Itoa(i), i+1)
	}
	if len(idf.gens) != 2 { // 1,000, then a quarter of it, but at least minFilterIDs
		t.Fatalf("%d generations for %d ids from a capacity of 1,000; want 2", len(idf.gens), n)
	}
	for i := range n {
		if id := "event-" + strconv.Itoa(i); idf.certainlyNew(id) {
			t.Fatalf("%q was added, and the filter says it is certainly new", id)
		}
	}
	maybe := 0
	for i := range n {
		if !idf.certainlyNew("other-" + strconv.Itoa(i)) {
			maybe++
		}
	}
	if rate := float64(maybe) / n; rate > 0.03 {
		t.Fatalf("false-positive rate %.2f%%, want at most 3%%", 100*rate)
	}
	idf.ready.Store(false)
	if idf.certainlyNew("other-1") {
		t.Fatal("a filter whose scan has not finished said an id is certainly new")
	}
}

// TestIDFilterRebuiltWhenFull: a filter that fills is rebuilt from the ids the shard stores,
// so a shard whose ids expire as fast as new ones come keeps a filter the size of what it
// stores, not of all it ever created; and no id stored is ever said to be new, before, during
// or after a rebuild.
func TestIDFilterRebuiltWhenFull(t *testing.T) {
	f := smallFilterFSM(t)
	var index uint64
	apply := func(c Command) any {
		index++
		return f.Apply(cmdLog(index, c))
	}
	const rounds, perRound = 40, 200
	rebuilt, last := 0, f.ap.idf
	for r := range rounds {
		ids := idRange(fmt.Sprintf("r%d-", r), 0, perRound)
		index++
		wantOutcomes(t, fmt.Sprintf("round %d", r), scheduleIDs(t, f, index, ids, 1), Created)
		index++
		wantOutcomes(t, fmt.Sprintf("round %d again", r), scheduleIDs(t, f, index, ids, 1), Existing)
		if f.ap.idf != last {
			last = f.ap.idf
			rebuilt++
		}
		// Settle and remove the round before last: the shard stores two rounds.
		if r >= 2 {
			old := idRange(fmt.Sprintf("r%d-", r-2), 0, perRound)
			apply(&Cancel{ProposedAt: int64(r), IDs: old})
			if res := apply(&Expire{Before: int64(r) + 1, Limit: 1 << 20}).(*ExpireResult); res.Expired != perRound {
				t.Fatalf("round %d: expired %d, want %d", r, res.Expired, perRound)
			}
		}
		// Let a rebuild's scan finish, as time would.
		if n := f.ap.idfNext; n != nil {
			<-n.done
		}
		if f.ap.idf.ready.Load() && r%5 == 4 {
			index++
			wantOutcomes(t, "stored ids", scheduleIDs(t, f, index, idRange(fmt.Sprintf("r%d-", r-1), 0, perRound), 1), Existing)
		}
	}
	capacity := 0
	for _, g := range f.ap.idf.gens {
		capacity += g.capacity
	}
	stored := int(f.Stats().Pending + f.Stats().Retained)
	if rebuilt < 3 || capacity > 8*max(stored, f.st.filterMin) {
		t.Fatalf("after %d ids created, %d stored: %d rebuilds, filter capacity %d ids", rounds*perRound, stored, rebuilt, capacity)
	}
	t.Logf("%d ids created, %d stored: %d rebuilds, filter capacity %d ids", rounds*perRound, stored, rebuilt, capacity)
}

// TestIDFilterGrowsWithoutScanning: a shard that only grows never rescans Pebble for its
// filter: each full generation brings one as large as all the others, so the filter doubles,
// its capacity stays within twice the ids stored, and every stored id stays "maybe".
func TestIDFilterGrowsWithoutScanning(t *testing.T) {
	f := smallFilterFSM(t)
	if err := f.LoadPending(maxDue, nil); err != nil { // as the shard owner does; starts the scan
		t.Fatal(err)
	}
	waitIDFilter(t, f)
	var index uint64
	const rounds, perRound = 32, 250 // 8,000 ids: five doublings of 256
	for r := range rounds {
		index++
		wantOutcomes(t, fmt.Sprintf("round %d", r), scheduleIDs(t, f, index, idRange(fmt.Sprintf("r%d-", r), 0, perRound), 1), Created)
		if f.ap.idfNext != nil {
			t.Fatalf("round %d: %d ids stored, none gone, and the filter is being rebuilt from a scan", r, (r+1)*perRound)
		}
	}
	capacity := 0
	for i, g := range f.ap.idf.gens {
		capacity += g.capacity
		if i > 0 && g.capacity < f.ap.idf.gens[i-1].capacity {
			t.Errorf("generation %d holds %d ids, less than the one before (%d): the filter does not double", i, g.capacity, f.ap.idf.gens[i-1].capacity)
		}
	}
	if stored := rounds * perRound; capacity > 2*stored || len(f.ap.idf.gens) > 7 {
		t.Fatalf("%d ids stored: %d generations, capacity %d", stored, len(f.ap.idf.gens), capacity)
	}
	for r := range rounds {
		index++
		wantOutcomes(t, fmt.Sprintf("round %d again", r), scheduleIDs(t, f, index, idRange(fmt.Sprintf("r%d-", r), 0, perRound), 1), Existing)
	}
}

// smallFilterFSM returns a shard's FSM whose filter generations start at 256 ids, so that a
// test fills them with a few thousand.
func smallFilterFSM(t *testing.T) *FSM {
	t.Helper()
	st := openTestStore(t, t.TempDir(), StoreOptions{Knobs: Knobs{MinFilterIDs: 256}})
	f, _ := newTestFSM(t, st, 3)
	t.Cleanup(func() {
		f.Close()
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// scheduleIDs applies one ScheduleBatch creating ids at index and returns the outcomes.
func scheduleIDs(t *testing.T, f *FSM, index uint64, ids []string, hash uint64) []ScheduleOutcome {
	t.Helper()
	c := &ScheduleBatch{ProposedAt: 1e18, Events: make([]NewEvent, len(ids))}
	for i, id := range ids {
		c.Events[i] = NewEvent{ID: id, Due: 2e18, Topic: "t", ContentHash: hash}
	}
	res, ok := f.Apply(cmdLog(index, c)).(*ScheduleBatchResult)
	if !ok {
		t.Fatalf("apply at %d: %T", index, res)
	}
	out := make([]ScheduleOutcome, len(res.Results))
	for i, r := range res.Results {
		out[i] = r.Outcome
	}
	return out
}

func idRange(prefix string, from, to int) []string {
	ids := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		ids = append(ids, prefix+strconv.Itoa(i))
	}
	return ids
}

// waitIDFilter waits for the scan of f's filter to end, and fails unless it read every id.
func waitIDFilter(t *testing.T, f *FSM) {
	t.Helper()
	idf := f.ap.idf
	if !idf.scanning {
		t.Fatal("the id filter's scan was never started")
	}
	select {
	case <-idf.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the id filter's scan did not finish in 10 s")
	}
	if !idf.ready.Load() {
		t.Fatal("the id filter's scan ended without reading every id")
	}
}

func wantOutcomes(t *testing.T, what string, got []ScheduleOutcome, want ScheduleOutcome) {
	t.Helper()
	for i, o := range got {
		if o != want {
			t.Fatalf("%s: event %d: %v, want %v", what, i, o, want)
		}
	}
}

// TestIDFilterCoversStoredIDs: a reopened or restored shard's filter holds the ids stored
// before it (the scan) and those applied while the scan ran, so an id is never created twice.
func TestIDFilterCoversStoredIDs(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir, StoreOptions{})
	f, _ := newTestFSM(t, st, 3)
	const n = 20_000
	var index uint64
	for from := 0; from < n; from += 5000 {
		index++
		wantOutcomes(t, "first schedule", scheduleIDs(t, f, index, idRange("old-", from, from+5000), 1), Created)
	}
	f.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// Hold the reopened shard's scan with its iterator open, and apply while it waits: those
	// ids are not in the scan's view, so apply must add them.
	opened, release := make(chan struct{}), make(chan struct{})
	st = openTestStore(t, dir, StoreOptions{Knobs: Knobs{IDScan: func() { opened <- struct{}{}; <-release }}})
	defer st.Close()
	f, _ = newTestFSM(t, st, 3)
	defer f.Close()
	var once sync.Once
	releaseScan := func() { once.Do(func() { close(release) }) }
	defer releaseScan()                                // before Close, which waits for the scan
	if err := f.LoadPending(maxDue, nil); err != nil { // as the shard owner does; starts the scan
		t.Fatal(err)
	}
	<-opened
	index++
	wantOutcomes(t, "new ids during the scan", scheduleIDs(t, f, index, idRange("new-", 0, 1000), 1), Created)
	index++
	wantOutcomes(t, "stored ids during the scan", scheduleIDs(t, f, index, idRange("old-", 0, n), 1), Existing)
	releaseScan()
	waitIDFilter(t, f)
	index++
	wantOutcomes(t, "stored ids after the scan", scheduleIDs(t, f, index, idRange("old-", 0, n), 2), Conflict)
	index++
	wantOutcomes(t, "ids applied during the scan", scheduleIDs(t, f, index, idRange("new-", 0, 1000), 1), Existing)

	// A restore replaces the ids: the filter is rebuilt from the restored state.
	snap := snapshotBytes(t, f)
	st2 := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st2.Close()
	g, _ := newTestFSM(t, st2, 3)
	defer g.Close()
	wantOutcomes(t, "other replica", scheduleIDs(t, g, 1, idRange("gone-", 0, 1000), 1), Created)
	waitIDFilter(t, g)
	if err := restore(g, snap); err != nil {
		t.Fatal(err)
	}
	if err := g.LoadPending(maxDue, nil); err != nil { // as the shard owner's Reset does
		t.Fatal(err)
	}
	waitIDFilter(t, g)
	index++
	wantOutcomes(t, "restored ids", scheduleIDs(t, g, index, idRange("old-", 0, n), 1), Existing)
	index++
	wantOutcomes(t, "ids the restore replaced", scheduleIDs(t, g, index, idRange("gone-", 0, 1000), 1), Created)
}
