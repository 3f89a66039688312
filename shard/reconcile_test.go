package shard

import (
	"slices"
	"testing"
)

func TestPlan(t *testing.T) {
	none := func(string) bool { return false }
	set := func(nodes ...string) func(string) bool {
		return func(n string) bool { return slices.Contains(nodes, n) }
	}
	all := func(string) bool { return true }
	base := func() configState {
		return configState{self: "a", voters: []string{"a", "b", "c"}, desired: []string{"a", "b", "c"},
			replication: 3, removed: none, leaving: none, caughtUp: all}
	}
	cases := []struct {
		name   string
		edit   func(*configState)
		kind   actionKind
		node   string
		toHead string
	}{
		{"converged: nothing to do", func(*configState) {}, noChange, "", ""},
		{"new desired node joins as a non-voter", func(s *configState) { s.desired = []string{"a", "b", "d"} }, addNonvoter, "d", ""},
		{"caught-up non-voter is promoted", func(s *configState) {
			s.desired, s.nonvoters = []string{"a", "b", "d"}, []string{"d"}
		}, promote, "d", ""},
		{"lagging non-voter: wait, change nothing else", func(s *configState) {
			s.desired, s.nonvoters, s.caughtUp = []string{"a", "b", "d"}, []string{"d"}, set("a", "b", "c")
		}, noChange, "", ""},
		{"non-voter no longer desired is dropped", func(s *configState) { s.nonvoters = []string{"d"} }, removeServer, "d", ""},
		{"surplus voter removed once its replacement is in", func(s *configState) {
			s.voters, s.desired = []string{"a", "b", "c", "d"}, []string{"a", "b", "d"}
		}, removeServer, "c", ""},
		{"leader leaving hands leadership over first", func(s *configState) {
			s.voters, s.desired = []string{"a", "b", "c", "d"}, []string{"b", "c", "d"}
		}, transfer, "", "b"},
		// Regression (found by the fault tests): a node that rejoined and
		// knew only itself computed desired = [a] and removed two live
		// voters. A view alone never takes a shard below its replication.
		{"partial view does not strip live voters", func(s *configState) { s.desired = []string{"a"} }, noChange, "", ""},
		{"dead voter with no spare stays (no shrink below R)", func(s *configState) { s.desired = []string{"a", "b"} }, noChange, "", ""},
		{"draining voter leaves even below R", func(s *configState) {
			s.desired, s.leaving = []string{"a", "b"}, set("c")
		}, removeServer, "c", ""},
		{"operator-removed voter leaves at once", func(s *configState) { s.removed = set("c") }, removeServer, "c", ""},
		{"never remove the last voter", func(s *configState) {
			s.voters, s.desired, s.replication, s.leaving = []string{"b"}, []string{"a"}, 1, set("b")
		}, addNonvoter, "a", ""},
		{"balance: leadership to the preferred leader", func(s *configState) {
			s.desired, s.balance = []string{"b", "a", "c"}, true
		}, transfer, "", "b"},
		{"no balancing outside the window", func(s *configState) { s.desired = []string{"b", "a", "c"} }, noChange, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := base()
			c.edit(&st)
			got := plan(st)
			if got.kind != c.kind || got.node != c.node || (c.toHead != "" && (len(got.to) == 0 || got.to[0] != c.toHead)) {
				t.Errorf("plan = %+v; want kind %d node %q to[0] %q", got, c.kind, c.node, c.toHead)
			}
		})
	}
}
