package raftfsm

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"testing"
)

// TestVerifySnapshotTargetsReportsEveryTopic: VerifySnapshotTargets reports the topic of
// every event a stream holds, pending or settled (a recurring schedule's occurrence among
// them), and of every schedule's definition, once each; it returns VerifySnapshot's header,
// fn's error as it is, and ErrBadSnapshot for a stream VerifySnapshot refuses.
func TestVerifySnapshotTargetsReportsEveryTopic(t *testing.T) {
	h := newRecurringHarness(t)
	h.apply(&ScheduleBatch{ProposedAt: sec(0).UnixNano(), Events: []NewEvent{
		{ID: "a", Due: sec(10).UnixNano(), Topic: "orders", Payload: []byte("p")},
		{ID: "b", Due: sec(20).UnixNano(), Topic: "chime.audit"},
		{ID: "c", Due: sec(30).UnixNano(), Topic: "billing"},
	}})
	h.apply(&Cancel{ProposedAt: sec(1).UnixNano(), IDs: []string{"c"}})
	def := everySecond(CatchUpLast)
	def.Topic = "ticks"
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "r", Hash: 1, Def: def})
	occurrence := OccurrenceID("r", h.next("r"))
	good := snapshotBytes(t, h.f)

	got := map[SnapshotTarget]int{}
	hdr, err := VerifySnapshotTargets(bytes.NewReader(good), 2, func(tg SnapshotTarget) error {
		got[tg]++
		return nil
	})
	if err != nil {
		t.Fatalf("a good stream: %v", err)
	}
	want := map[SnapshotTarget]int{
		{ID: "a", Topic: "orders"}: 1, {ID: "b", Topic: "chime.audit"}: 1, {ID: "c", Topic: "billing"}: 1,
		{ID: occurrence, Topic: "ticks"}: 1, {ID: "r", Schedule: true, Topic: "ticks"}: 1,
	}
	if !maps.Equal(got, want) {
		t.Errorf("reported %v\nwant %v", got, want)
	}
	if vh, verr := VerifySnapshot(bytes.NewReader(good), 2); verr != nil || vh != hdr {
		t.Errorf("header %+v, VerifySnapshot's %+v (%v)", hdr, vh, verr)
	}

	stop := errors.New("stop")
	calls := 0
	if _, err := VerifySnapshotTargets(bytes.NewReader(good), 2, func(SnapshotTarget) error { calls++; return stop }); err != stop || calls != 1 {
		t.Errorf("fn's error: %v after %d calls, want it as it is after 1", err, calls)
	}

	flipped := slices.Clone(good)
	flipped[len(flipped)-6] ^= 0x40
	for name, data := range map[string][]byte{
		"a flipped byte":                flipped,
		"truncated before the checksum": good[:len(good)-4],
		"truncated in the frames":       good[:len(good)/2],
	} {
		if _, err := VerifySnapshotTargets(bytes.NewReader(data), 2, func(SnapshotTarget) error { return nil }); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v, want ErrBadSnapshot", name, err)
		}
		if _, err := VerifySnapshot(bytes.NewReader(data), 2); err == nil {
			t.Errorf("%s: VerifySnapshot passes it: the case tests nothing", name)
		}
	}
	calls = 0
	if _, err := VerifySnapshotTargets(bytes.NewReader(good), 3, func(SnapshotTarget) error { calls++; return nil }); !errors.Is(err, ErrBadSnapshot) || calls != 0 {
		t.Errorf("another shard's stream: %v after %d calls, want ErrBadSnapshot before any", err, calls)
	}
}
