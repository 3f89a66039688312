package shard

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/raftfsm"
)

// TestBackupPlantedFoundsTheShardAgain: a backup taken on the leader holds
// everything acknowledged before it; planted as the Raft snapshot of an empty
// replica on another node, it is restored when that replica opens, which
// leads alone with exactly the backed-up state, takes new entries after it
// (none skipped as already applied), and keeps all of it across a restart.
func TestBackupPlantedFoundsTheShardAgain(t *testing.T) {
	ctx := context.Background()
	r := newCrashRig(t)
	s := r.mustOpen(true)
	r.schedule(s, 0, 30)
	for _, id := range []string{"e3", "e7"} {
		if res, err := s.Cancel(ctx, id, nil); err != nil || res.Outcome != raftfsm.Cancelled {
			t.Fatalf("cancel %s: %+v, %v", id, res, err)
		}
	}
	var buf bytes.Buffer
	h, err := s.Backup(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	wantIndex, wantDigest, err := s.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if h.Shard != 0 || h.AppliedIndex != wantIndex || h.AppliedIndex < 32 {
		t.Fatalf("backup header %+v; the replica is at %d after 32 entries", h, wantIndex)
	}
	if v, err := raftfsm.VerifySnapshot(bytes.NewReader(buf.Bytes()), 0); err != nil || v != h {
		t.Fatalf("VerifySnapshot: %+v, %v; want %+v", v, err, h)
	}
	want := s.Stats()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	n := newCrashRig(t)
	self := raft.Server{Suffrage: raft.Voter, ID: "n1", Address: raft.ServerAddress(n.addr)}
	if err := PlantSnapshot(n.dir, self, h, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if err := PlantSnapshot(n.dir, self, h, bytes.NewReader(buf.Bytes())); err == nil || !strings.Contains(err.Error(), "already holds Raft state") {
		t.Fatalf("a second plant in the same directory: %v, want a refusal", err)
	}
	p := n.mustOpen(false)
	waitFor(t, 10*time.Second, "the planted replica leads", p.IsLeader)
	gotIndex, gotDigest, err := p.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if gotIndex != wantIndex || gotDigest != wantDigest || p.Stats() != want {
		t.Fatalf("planted replica at %d digest %x stats %+v; backed up at %d digest %x stats %+v",
			gotIndex, gotDigest, p.Stats(), wantIndex, wantDigest, want)
	}
	if voters, _, err := p.Configuration(); err != nil || len(voters) != 1 || voters[0] != "n1" {
		t.Fatalf("voters %v (%v), want [n1]", voters, err)
	}
	n.schedule(p, 30, 40)
	if p.AppliedIndex() <= wantIndex || p.Stats().Pending != want.Pending+10 {
		t.Fatalf("after 10 new events: applied %d (backup at %d), pending %d; want %d",
			p.AppliedIndex(), wantIndex, p.Stats().Pending, want.Pending+10)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = n.mustOpen(false)
	defer p.Close()
	waitFor(t, 10*time.Second, "the planted replica leads again", p.IsLeader)
	if got := p.Stats().Pending; got != want.Pending+10 {
		t.Fatalf("after a restart %d pending, want %d", got, want.Pending+10)
	}
	if rec, ok, err := p.Get(ctx, "e7"); err != nil || !ok || rec.State != raftfsm.StateCancelled {
		t.Fatalf("e7 after restore: %+v %v %v, want cancelled", rec, ok, err)
	}
	if _, err := p.Backup(ctx, &bytes.Buffer{}); err != nil {
		t.Fatalf("a backup of the planted replica: %v", err)
	}
}
