package raftfsm

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// countTags counts the shard's keys by tag.
func countTags(t *testing.T, st *Store, shard uint32) map[byte]int {
	t.Helper()
	n := map[byte]int{}
	for _, kv := range dumpShard(t, st, shard) {
		n[kv.k[shardPrefixLen]]++
	}
	return n
}

// TestExpire walks retention once, readably: Expire removes the oldest settled events
// (by the time they settled, then seq) up to its limit, every key of each, and nothing
// pending; a mark for a removed event says so; its id is free again.
func TestExpire(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 5)
	g := newGen(1)
	var evs []NewEvent
	for _, id := range []string{"a", "b", "c", "d", "e", "p"} {
		evs = append(evs, g.event(id, 0))
	}
	i := uint64(0)
	apply := func(c Command) interface{} {
		t.Helper()
		i++
		return f.Apply(cmdLog(i, c))
	}
	apply(&ScheduleBatch{ProposedAt: 1, Events: evs})
	due := func(seq uint64) int64 { return evs[seq-1].Due }
	apply(&MarkFired{ProposedAt: 100, DueKnown: true, Entries: []Fired{{Seq: 2, FiredAt: 100, Due: due(2)}, {Seq: 1, FiredAt: 100, Due: due(1)}}})
	apply(&Cancel{ProposedAt: 200, IDs: []string{"c"}})
	apply(&MarkDeadLettered{ProposedAt: 300, DueKnown: true, Entries: []DeadLettered{{Seq: 4, At: 300, Due: due(4)}}})
	apply(&MarkFired{ProposedAt: 400, Entries: []Fired{{Seq: 5, FiredAt: 400}}})
	if at, ok, err := f.OldestSettled(); err != nil || !ok || at != 100 {
		t.Fatalf("OldestSettled = %d, %v, %v; want 100", at, ok, err)
	}

	if r := apply(&Expire{Before: 250, Limit: 1}).(*ExpireResult); r.Expired != 1 {
		t.Fatalf("first Expire removed %d, want 1 (its limit)", r.Expired)
	}
	if _, found, _ := f.Get("b"); !found {
		t.Fatal("b (seq 2) expired before a (seq 1), which settled at the same time")
	}
	if _, found, _ := f.Get("a"); found {
		t.Fatal("a was not the first to expire")
	}
	if r := apply(&Expire{Before: 250, Limit: 10}).(*ExpireResult); r.Expired != 2 {
		t.Fatalf("second Expire removed %d, want 2 (b and c)", r.Expired)
	}
	for id, want := range map[string]bool{"a": false, "b": false, "c": false, "d": true, "e": true, "p": true} {
		if _, found, err := f.Get(id); err != nil || found != want {
			t.Fatalf("Get(%q): found=%v err=%v, want found=%v", id, found, err, want)
		}
	}
	want := map[byte]int{tagMeta: 1, tagID: 3, tagBody: 3, tagDue: 1, tagStatus: 2, tagSettled: 2}
	if got := countTags(t, st, 5); len(got) != len(want) || got[tagID] != 3 || got[tagBody] != 3 || got[tagDue] != 1 || got[tagStatus] != 2 || got[tagSettled] != 2 {
		t.Fatalf("keys by tag after expiring a, b, c: %v, want %v", got, want)
	}
	s := f.Stats()
	if s.Expired != 3 || s.Retained != 2 || s.Pending != 1 || f.ReclaimedBytes() == 0 {
		t.Fatalf("Stats after expiring 3: %+v", s)
	}
	if r := apply(&MarkFired{ProposedAt: 500, Entries: []Fired{{Seq: 1, FiredAt: 500}}}).(*MarkBatchResult); r.Outcomes[0] != WasExpired {
		t.Fatalf("MarkFired of an expired event: %v, want WasExpired", r.Outcomes[0])
	}
	if r := apply(&Cancel{ProposedAt: 500, IDs: []string{"c"}}).(*CancelBatchResult); r.Results[0].Outcome != NotFound {
		t.Fatalf("Cancel of an expired id: %v, want NotFound", r.Results[0].Outcome)
	}
	r := apply(&ScheduleBatch{ProposedAt: 600, Events: []NewEvent{evs[0]}}).(*ScheduleBatchResult)
	if r.Results[0].Outcome != Created || r.Results[0].Seq != 7 {
		t.Fatalf("Schedule of an expired id: %+v, want Created with seq 7", r.Results[0])
	}
	if r := apply(&Expire{Before: 1000, Limit: 10}).(*ExpireResult); r.Expired != 2 {
		t.Fatalf("Expire past everything removed %d, want d and e", r.Expired)
	}
	if _, ok, _ := f.OldestSettled(); ok {
		t.Fatal("OldestSettled found an event after all settled ones expired")
	}
	if s := f.Stats(); s.Pending != 2 || s.Retained != 0 || s.Expired != 5 {
		t.Fatalf("Stats at the end: %+v", s)
	}
}

// TestExpireSeesItsOwnBatch: an Expire applied in one ApplyBatch with the entries that
// created and settled its events removes exactly what it removes applied alone, and a
// Schedule after it in the same batch creates the id anew.
func TestExpireSeesItsOwnBatch(t *testing.T) {
	g := newGen(2)
	a, b := g.event("x", 0), g.event("y", 1)
	logs := []*raft.Log{
		cmdLog(1, &ScheduleBatch{ProposedAt: 1, Events: []NewEvent{a, b}}),
		cmdLog(2, &MarkFired{ProposedAt: 10, DueKnown: true, Entries: []Fired{{Seq: 1, FiredAt: 10, Due: a.Due}}}),
		cmdLog(3, &Cancel{ProposedAt: 20, IDs: []string{"y"}}),
		cmdLog(4, &Expire{Before: 15, Limit: 5}),
		cmdLog(5, &ScheduleBatch{ProposedAt: 30, Events: []NewEvent{a}}),
		cmdLog(6, &Expire{Before: 25, Limit: 5}),
		cmdLog(7, &ScheduleBatch{ProposedAt: 40, Events: []NewEvent{b}}),
	}
	sa, sb, fa, fb := twoReplicas(t, 1)
	var ra []interface{}
	for _, l := range logs {
		ra = append(ra, fa.Apply(l))
	}
	rb := fb.ApplyBatch(logs)
	for i := range ra {
		if show(ra[i]) != show(rb[i]) {
			t.Fatalf("entry %d: alone %s, in one batch %s", i+1, show(ra[i]), show(rb[i]))
		}
	}
	if got := rb[4].(*ScheduleBatchResult).Results[0]; got.Outcome != Created || got.Seq != 3 {
		t.Fatalf("re-scheduling an id expired earlier in the batch: %+v", got)
	}
	if got := rb[5].(*ExpireResult).Expired; got != 1 {
		t.Fatalf("the second Expire removed %d, want 1 (y)", got)
	}
	if got := rb[6].(*ScheduleBatchResult).Results[0]; got.Outcome != Created || got.Seq != 4 {
		t.Fatalf("re-scheduling y: %+v", got)
	}
	sameReplicas(t, "applied alone vs in one batch", sa, sb, fa, fb)
}

// layout2 rewrites shard's keys in st as the version before retention stored them: no
// settled-time index (or only the part a crash left), and the meta in layout 2.
func layout2(t *testing.T, st *Store, shard uint32, keepEvery int) {
	t.Helper()
	b := st.db.NewBatch()
	n := 0
	for _, kv := range dumpShard(t, st, shard) {
		switch kv.k[shardPrefixLen] {
		case tagSettled:
			if n++; keepEvery == 0 || n%keepEvery != 0 {
				if err := b.Delete(kv.k, nil); err != nil {
					t.Fatal(err)
				}
			}
		case tagMeta:
			if err := b.Set(kv.k, metaV2(t, kv.v), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
}

// metaV2 re-encodes a layout 3 meta value in layout 2; it must have expired nothing.
func metaV2(t *testing.T, v []byte) []byte {
	t.Helper()
	m, err := decodeMeta(v)
	if err != nil || m.expired != 0 {
		t.Fatalf("metaV2: %+v, %v", m, err)
	}
	return append([]byte{layoutV2}, v[1:metaLenV2]...)
}

// logWithoutExpire is a random log with no Expire entry: the state a version before
// retention could have written.
func logWithoutExpire(seed uint64, n int) []*raft.Log {
	g := newGen(seed)
	g.noExpire = true
	return genLogFrom(g, n)
}

// TestUpgradeFromLayout2: a shard stored in key layout 2, whole or with part of the index a
// crashed upgrade wrote, opens in layout 3 with exactly the keys the same log writes in
// layout 3.
func TestUpgradeFromLayout2(t *testing.T) {
	logs := logWithoutExpire(41, 400)
	ref := openTestStore(t, t.TempDir(), StoreOptions{})
	defer ref.Close()
	fr, _ := newTestFSM(t, ref, 6)
	fr.ApplyBatch(logs)
	want := dumpShard(t, ref, 6)
	if countTags(t, ref, 6)[tagSettled] < 20 {
		t.Fatal("the log settles too few events to prove much")
	}

	for _, keep := range []int{0, 3} {
		st := openTestStore(t, t.TempDir(), StoreOptions{})
		f, _ := newTestFSM(t, st, 6)
		f.ApplyBatch(logs)
		f.Close()
		layout2(t, st, 6, keep)
		f, _ = newTestFSM(t, st, 6)
		sameKeySpace(t, "upgraded from layout 2", want, dumpShard(t, st, 6))
		if f.Stats() != fr.Stats() {
			t.Fatalf("Stats after the upgrade: %+v, want %+v", f.Stats(), fr.Stats())
		}
		f.Close()
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRestoreFormat2Stream: a snapshot stream in format 2 (key layout 2, as a leader running
// the version before sends it) restores, and leaves the shard in layout 3.
func TestRestoreFormat2Stream(t *testing.T) {
	logs := logWithoutExpire(42, 300)
	src := openTestStore(t, t.TempDir(), StoreOptions{})
	defer src.Close()
	fs, _ := newTestFSM(t, src, 2)
	fs.ApplyBatch(logs)
	want := dumpShard(t, src, 2)

	old := format2(t, snapshotBytes(t, fs))
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 2)
	if err := restore(f, old); err != nil {
		t.Fatalf("restore of a format 2 stream: %v", err)
	}
	sameKeySpace(t, "restored from format 2", want, dumpShard(t, st, 2))
}

// format2 rewrites a format 3 stream as the version before retention wrote it.
func format2(t *testing.T, stream []byte) []byte {
	t.Helper()
	header, frames := splitStream(t, stream)
	binary.BigEndian.PutUint32(header[len(snapshotMagic):], snapshotFormatOld)
	var kept []frame
	for _, f := range frames {
		switch f.key[0] {
		case tagSettled:
			continue
		case tagMeta:
			f.val = metaV2(t, f.val)
		}
		kept = append(kept, f)
	}
	return joinStream(t, header, kept)
}

// TestPowerCutDuringCleanUp: power cuts at random points of a log full of Expire entries,
// with Pebble flushing at random points in between, followed by what raft does on restart
// (apply the log after the applied index), end in exactly the state of a replica that never
// crashed: nothing acknowledged is lost and nothing expired comes back. Half the cuts fall
// while the pending set is being built.
func TestPowerCutDuringCleanUp(t *testing.T) {
	logs := genLog(51, 1500)
	expires := 0
	for _, l := range logs {
		if l.Type == raft.LogCommand && CommandType(l.Data[0]) == TypeExpire {
			expires++
		}
	}
	if expires < 50 {
		t.Fatalf("only %d Expire entries", expires)
	}
	ref := openTestStore(t, t.TempDir(), StoreOptions{})
	defer ref.Close()
	fr, _ := newTestFSM(t, ref, 3)
	fr.ApplyBatch(logs)

	rng := rand.New(rand.NewPCG(51, 1))
	// Every other opening holds its pending set's build until it is cut, so that apply
	// answers from Pebble throughout and the cut falls in the middle of a build. holdBuild
	// releases the last opening's hold and returns the knobs of the next opening.
	var hold chan struct{}
	holdBuild := func() Knobs {
		if hold != nil {
			close(hold)
			hold = nil
		}
		if rng.IntN(2) != 0 {
			return Knobs{}
		}
		h := make(chan struct{})
		hold = h
		return Knobs{PendingBuild: func(stop <-chan struct{}) {
			select {
			case <-h:
			case <-stop:
			}
		}}
	}
	defer func() {
		if hold != nil {
			close(hold)
		}
	}()
	mem := vfs.NewCrashableMem()
	st := openTestStore(t, "db", StoreOptions{FS: mem, Knobs: holdBuild()})
	f, _ := newTestFSM(t, st, 3)
	cuts, unloaded := 0, 0
	for next := 0; next < len(logs); {
		n := min(1+rng.IntN(40), len(logs)-next)
		if !f.pending.loaded {
			unloaded += n
		}
		f.ApplyBatch(logs[next : next+n])
		next += n
		if rng.IntN(3) == 0 {
			if err := st.db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(4) == 0 {
			crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(100), RNG: rand.New(rand.NewPCG(uint64(next), 2))})
			f.Close()
			knobs := holdBuild()
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			mem = crashed
			st = openTestStore(t, "db", StoreOptions{FS: mem, Knobs: knobs})
			f, _ = newTestFSM(t, st, 3)
			next = int(f.AppliedIndex()) // raft replays the log after it
			cuts++
		}
	}
	sameKeySpace(t, "after power cuts during the clean-up", dumpShard(t, ref, 3), dumpShard(t, st, 3))
	if got, want := f.Stats(), fr.Stats(); got != want {
		t.Fatalf("Stats after power cuts: %+v, want %+v", got, want)
	}
	f.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if unloaded < len(logs)/4 {
		t.Fatalf("only %d of %d entries applied before a pending set was loaded", unloaded, len(logs))
	}
	t.Logf("%d entries (%d Expire), %d power cuts, %d entries applied without a pending set", len(logs), expires, cuts, unloaded)
}
