package membership

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Alive: "alive", Suspect: "suspect", Dead: "dead", Left: "left", State(9): "State(9)"} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}

func TestCandidates(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	const deadTimeout = 10 * time.Minute
	params := Meta{ClusterID: "c1", Shards: 16, Replication: 3}
	member := func(id string, st State, ago time.Duration, edit ...func(*Meta)) Member {
		m := params
		m.NodeID = id
		for _, e := range edit {
			e(&m)
		}
		return Member{Meta: m, State: st, Since: now.Add(-ago), GossipAddr: "127.0.0.1:1"}
	}
	draining := func(m *Meta) { m.Draining = true }
	otherCluster := func(m *Meta) { m.ClusterID = "c2" }
	otherShards := func(m *Meta) { m.Shards = 32 }
	noParams := func(m *Meta) { m.ClusterID, m.Shards, m.Replication = "", 0, 0 }

	tests := []struct {
		name    string
		members []Member
		removed map[string]bool
		want    []string
	}{
		{"alive and suspect are candidates, sorted",
			[]Member{member("self", Alive, time.Hour), member("c", Alive, 0), member("b", Suspect, time.Hour)},
			nil, []string{"b", "c", "self"}},
		{"dead within the timeout is kept",
			[]Member{member("self", Alive, time.Hour), member("d", Dead, deadTimeout-time.Nanosecond)},
			nil, []string{"d", "self"}},
		{"dead at or past the timeout is dropped",
			[]Member{member("self", Alive, time.Hour), member("d", Dead, deadTimeout), member("e", Dead, time.Hour)},
			nil, []string{"self"}},
		{"left follows the same timeout",
			[]Member{member("self", Alive, time.Hour), member("l1", Left, time.Minute), member("l2", Left, 2*deadTimeout)},
			nil, []string{"l1", "self"}},
		{"draining is dropped even when alive",
			[]Member{member("self", Alive, time.Hour), member("a", Alive, time.Hour, draining), member("d", Dead, time.Second, draining)},
			nil, []string{"self"}},
		{"removed is dropped whatever its state",
			[]Member{member("self", Alive, time.Hour), member("a", Alive, time.Hour), member("b", Dead, time.Second)},
			map[string]bool{"a": true, "b": true, "zz": true}, []string{"self"}},
		{"removed false does not remove",
			[]Member{member("self", Alive, time.Hour), member("a", Alive, time.Hour)},
			map[string]bool{"a": false}, []string{"a", "self"}},
		{"other cluster parameters are never candidates",
			[]Member{member("self", Alive, time.Hour), member("x", Alive, time.Hour, otherCluster), member("y", Alive, time.Hour, otherShards), member("z", Alive, time.Hour, noParams)},
			nil, []string{"self"}},
		{"self draining is dropped too",
			[]Member{member("self", Alive, time.Hour, draining), member("a", Alive, time.Hour)},
			nil, []string{"a"}},
		{"unknown state is not a candidate",
			[]Member{member("self", Alive, time.Hour), member("q", State(42), 0)},
			nil, []string{"self"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := View{Self: "self", Members: map[string]Member{}}
			for _, m := range tt.members {
				v.Members[m.Meta.NodeID] = m
			}
			got := v.Candidates(now, deadTimeout, tt.removed)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Candidates = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLive(t *testing.T) {
	v := View{Self: "a", Members: map[string]Member{
		"a": {State: Alive}, "c": {State: Suspect}, "b": {State: Alive, Meta: Meta{Draining: true}},
		"d": {State: Dead}, "e": {State: Left},
	}}
	if got, want := v.Live(), []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("Live = %v, want %v", got, want)
	}
}

func TestViewClusterParams(t *testing.T) {
	p := ClusterParams{ClusterID: "c1", Shards: 16, Replication: 3}
	m := func(st State, p ClusterParams) Member {
		return Member{State: st, Meta: Meta{ClusterID: p.ClusterID, Shards: p.Shards, Replication: p.Replication}}
	}
	other := ClusterParams{ClusterID: "c2", Shards: 16, Replication: 3}

	v := View{Self: "new", Members: map[string]Member{"new": m(Alive, ClusterParams{}), "a": m(Alive, p), "b": m(Alive, p), "c": m(Alive, ClusterParams{})}}
	if got, err := v.ClusterParams(); err != nil || got != p {
		t.Fatalf("ClusterParams = %v, %v; want %v", got, err, p)
	}
	// Self does not vote: a node checks its stored params against the others.
	v.Members["new"] = m(Alive, other)
	if got, err := v.ClusterParams(); err != nil || got != p {
		t.Fatalf("with a different Self: ClusterParams = %v, %v; want %v", got, err, p)
	}
	// Dead members do not vote.
	v.Members["d"] = m(Dead, other)
	if got, err := v.ClusterParams(); err != nil || got != p {
		t.Fatalf("with a dead member of another cluster: ClusterParams = %v, %v; want %v", got, err, p)
	}
	v.Members["e"] = m(Alive, other)
	if _, err := v.ClusterParams(); !errors.Is(err, ErrClusterParamsDisagree) {
		t.Fatalf("live members disagree: got %v, want ErrClusterParamsDisagree", err)
	}
	lonely := View{Self: "new", Members: map[string]Member{"new": m(Alive, p), "c": m(Alive, ClusterParams{})}}
	if _, err := lonely.ClusterParams(); !errors.Is(err, ErrNoClusterParams) {
		t.Fatalf("no other member has params: got %v, want ErrNoClusterParams", err)
	}
}
