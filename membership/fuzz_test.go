package membership

import (
	"maps"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// FuzzNodeMeta: node metadata arrives by gossip from any node that reaches this one.
// decodeMeta never panics; what it accepts advertises no cluster parameters or parameters a
// cluster can have (a node that joins learns them, stores them and sizes its shards by them),
// and re-encodes to bytes that decode to the same Meta. memberFromNode, the receive path,
// keeps the gossip name as the id, and of undecodable metadata nothing else.
func FuzzNodeMeta(f *testing.F) {
	for _, m := range []Meta{
		{NodeID: "node-1", GRPCAddr: "10.0.0.1:7400", RaftAddr: "10.0.0.1:7401", HTTPAddr: "10.0.0.1:7402",
			Draining: true, ClusterID: "c-7f3a", Shards: 64, Replication: 3, Retention: 7 * 24 * time.Hour},
		{NodeID: "n"},
	} {
		b, err := encodeMeta(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(m.NodeID, b)
	}
	f.Add("n", []byte(`null`))
	f.Fuzz(func(t *testing.T, name string, b []byte) {
		m, err := decodeMeta(b)
		if err == nil {
			if p := m.ClusterParams(); !p.IsZero() && (p.Shards < 1 || p.Shards > MaxShards || p.Retention < 0) {
				t.Fatalf("%q decodes to %+v: no cluster has these parameters", b, p)
			}
			if again, err := encodeMeta(m); err == nil {
				if d, err := decodeMeta(again); err != nil || d != m {
					t.Fatalf("%q decodes to %+v; re-encoded (%q), to %+v, %v", b, m, again, d, err)
				}
			}
		}
		_, d := newDelegateForTest(time.Unix(0, 0))
		mem := d.memberFromNode(&memberlist.Node{Name: name, Meta: b})
		want := Meta{NodeID: name}
		if err == nil {
			want = m
			want.NodeID = name
		}
		if mem.Meta != want {
			t.Fatalf("node %q with metadata %q is member %+v, want %+v", name, b, mem.Meta, want)
		}
	})
}

// FuzzLeaveMessage: a user message arrives from any node. NotifyMsg never panics; anything
// but a leave announcement (leaveMessage) changes nothing; an announcement marks a live member
// as leaving and turns a dead one Left, and nothing else.
func FuzzLeaveMessage(f *testing.F) {
	f.Add(leaveMessage("alive"))
	f.Add(leaveMessage("dead"))
	f.Add(leaveMessage("left"))
	f.Add(leaveMessage("stranger"))
	f.Add([]byte{msgLeaving})
	f.Add([]byte{2, 'a'})
	f.Fuzz(func(t *testing.T, msg []byte) {
		m, d := newDelegateForTest(time.Unix(0, 0))
		m.members["alive"] = Member{Meta: Meta{NodeID: "alive"}, State: Alive}
		m.members["dead"] = Member{Meta: Meta{NodeID: "dead"}, State: Dead}
		m.members["left"] = Member{Meta: Meta{NodeID: "left"}, State: Left}
		before := maps.Clone(m.members)
		d.NotifyMsg(msg)
		wantLeaving := map[string]bool{}
		if len(msg) > 1 && msg[0] == msgLeaving {
			switch id := string(msg[1:]); before[id].State {
			case Alive:
				if _, ok := before[id]; ok {
					wantLeaving[id] = true
				}
			case Dead:
				mem := before[id]
				mem.State = Left
				before[id] = mem
			}
			if string(leaveMessage(string(msg[1:]))) != string(msg) {
				t.Fatalf("announcement %q is not leaveMessage(%q)", msg, msg[1:])
			}
		}
		if !maps.Equal(m.members, before) || !maps.Equal(m.leaving, wantLeaving) {
			t.Fatalf("message %q: members %v leaving %v, want %v and %v", msg, m.members, m.leaving, before, wantLeaving)
		}
	})
}
