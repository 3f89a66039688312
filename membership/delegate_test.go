package membership

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// newDelegateForTest builds the state the delegate works on, without
// memberlist, to drive the orderings real gossip produces only by chance.
func newDelegateForTest(now time.Time) (*Membership, *delegate) {
	m := &Membership{
		now:     func() time.Time { return now },
		log:     quietLogger(),
		changes: make(chan struct{}, 1),
		meta:    Meta{NodeID: "self"},
		members: map[string]Member{},
		leaving: map[string]bool{},

		conflictLogged: map[string]time.Time{},
	}
	return m, &delegate{m: m}
}

func node(t *testing.T, id string, port uint16) *memberlist.Node {
	t.Helper()
	b, err := encodeMeta(Meta{NodeID: id, RaftAddr: "10.0.0.1:7401"})
	if err != nil {
		t.Fatal(err)
	}
	return &memberlist.Node{Name: id, Addr: net.IPv4(127, 0, 0, 1), Port: port, Meta: b}
}

func drained(m *Membership) bool {
	select {
	case <-m.changes:
		return true
	default:
		return false
	}
}

func TestLeaveAnnouncementOrderings(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	announce := append([]byte{msgLeaving}, "x"...)

	// Announcement first, then memberlist reports the node gone: Left.
	m, d := newDelegateForTest(now)
	d.NotifyJoin(node(t, "x", 1))
	d.NotifyMsg(announce)
	if got := m.View().Members["x"].State; got != Alive {
		t.Fatalf("announcement alone made x %s; it must stay alive until it is gone", got)
	}
	d.NotifyLeave(node(t, "x", 1))
	if got := m.View().Members["x"]; got.State != Left || !got.Since.Equal(now) {
		t.Fatalf("announced then gone: x is %s since %s, want left since %s", got.State, got.Since, now)
	}

	// Gone first (the leave gossip overtook the announcement), then the
	// announcement: Dead turns Left, and watchers are told.
	m, d = newDelegateForTest(now)
	d.NotifyJoin(node(t, "x", 1))
	d.NotifyLeave(node(t, "x", 1))
	if got := m.View().Members["x"].State; got != Dead {
		t.Fatalf("gone without announcement: x is %s, want dead", got)
	}
	drained(m)
	d.NotifyMsg(announce)
	if got := m.View().Members["x"].State; got != Left {
		t.Fatalf("late announcement: x is %s, want left", got)
	}
	if !drained(m) {
		t.Fatal("late announcement changed the view without a Changes notification")
	}

	// An announcement is forgotten when the node comes back: its next
	// failure is a failure.
	m, d = newDelegateForTest(now)
	d.NotifyJoin(node(t, "x", 1))
	d.NotifyMsg(announce)
	d.NotifyLeave(node(t, "x", 1))
	d.NotifyJoin(node(t, "x", 2))
	if got := m.View().Members["x"]; got.State != Alive || got.GossipAddr != "127.0.0.1:2" {
		t.Fatalf("rejoined: x is %s at %s, want alive at 127.0.0.1:2", got.State, got.GossipAddr)
	}
	d.NotifyLeave(node(t, "x", 2))
	if got := m.View().Members["x"].State; got != Dead {
		t.Fatalf("failed after rejoining: x is %s, want dead", got)
	}

	// Announcements about unknown nodes and garbage are ignored.
	m, d = newDelegateForTest(now)
	d.NotifyMsg(append([]byte{msgLeaving}, "nobody"...))
	d.NotifyMsg([]byte{42, 'x'})
	d.NotifyMsg(nil)
	if len(m.View().Members) != 0 || len(m.leaving) != 0 {
		t.Fatalf("stray messages changed state: members %v, leaving %v", m.View().Members, m.leaving)
	}
}

// TestUndecodableMeta: a node whose metadata cannot be decoded is in the
// view under its gossip name but advertises no cluster, so it is never a
// placement candidate.
func TestUndecodableMeta(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m, d := newDelegateForTest(now)
	m.meta = Meta{NodeID: "self", ClusterID: "c", Shards: 4, Replication: 3}
	self, err := encodeMeta(m.meta)
	if err != nil {
		t.Fatal(err)
	}
	d.NotifyJoin(&memberlist.Node{Name: "self", Addr: net.IPv4(127, 0, 0, 1), Port: 1, Meta: self})
	d.NotifyJoin(&memberlist.Node{Name: "junk", Addr: net.IPv4(127, 0, 0, 1), Port: 2, Meta: []byte("{not json")})
	v := m.View()
	if got := v.Members["junk"]; got.State != Alive || got.Meta != (Meta{NodeID: "junk"}) {
		t.Fatalf("junk member = %+v, want alive with only its id", got)
	}
	if got := v.Candidates(now, time.Minute, nil); len(got) != 1 || got[0] != "self" {
		t.Fatalf("Candidates = %v, want [self]", got)
	}
}
