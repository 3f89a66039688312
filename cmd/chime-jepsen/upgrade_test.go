package main

import (
	"slices"
	"strings"
	"testing"
)

// The usage chimed serve prints, as Go's flag package writes it: a valued flag's line names
// its type, a boolean's does not.
const newUsage = `Usage: chimed serve [flags]

Flags:
  -console
    	serve the web console under /ui/
  -data-dir dir
    	where the node keeps its state
  -ingest-topics topics
    	consume these topics
  -insecure
    	no TLS
  -node-id id
    	this node's id
`

func TestOldBuildDropsFlagsItDoesNotKnow(t *testing.T) {
	current := parseFlagUsage(strings.NewReader(newUsage))
	want := map[string]bool{"console": false, "data-dir": true, "ingest-topics": true, "insecure": false, "node-id": true}
	if len(current) != len(want) {
		t.Fatalf("parsed %v, want %v", current, want)
	}
	for f, v := range want {
		if got, ok := current[f]; !ok || got != v {
			t.Fatalf("flag %s: parsed %v %v, want %v", f, got, ok, v)
		}
	}
	old := map[string]bool{"data-dir": true, "insecure": false, "node-id": true}
	b := &chimedBuild{label: buildOld, unknown: unknownFlags(current, old), arity: current}
	args := []string{"serve", "--node-id", "n1", "--ingest-topics", "chime.schedule", "--console", "--data-dir", "/d", "--ingest-topics=x", "--insecure"}
	got := b.args(args)
	if w := []string{"serve", "--node-id", "n1", "--data-dir", "/d", "--insecure"}; !slices.Equal(got, w) {
		t.Fatalf("old build's args %q, want %q", got, w)
	}
	if d := b.droppedFlags(args); !slices.Equal(d, []string{"--console", "--ingest-topics"}) {
		t.Fatalf("dropped %q", d)
	}
	cur := &chimedBuild{label: buildNew}
	if got := cur.args(args); !slices.Equal(got, args) {
		t.Fatalf("the current build's args changed: %q", got)
	}
}

// TestUpgradeWalk: the upgrade nemesis moves one node at a time from old to current until
// none runs old, then back, and the cluster is mixed between the ends.
func TestUpgradeWalk(t *testing.T) {
	old, cur := &chimedBuild{label: buildOld}, &chimedBuild{label: buildNew}
	c := &cluster{}
	for i := range 5 {
		c.nodes = append(c.nodes, &node{i: i + 1, build: old})
	}
	nm := &nemesis{c: c, r: newRand(1, 7), current: cur, old: old}
	var olds []int
	for range 20 {
		n, to := nm.nextUpgrade()
		if n.currentBuild() == to {
			t.Fatalf("moved %d to the build it runs", n.i)
		}
		n.setBuild(to)
		k := 0
		for _, n := range c.nodes {
			if n.currentBuild() == old {
				k++
			}
		}
		olds = append(olds, k)
	}
	want := []int{4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5}
	if !slices.Equal(olds, want) {
		t.Fatalf("nodes on the old build after each step %v, want %v", olds, want)
	}
}

func TestMixedDrawsUpgradeOnlyWithAnOldBuild(t *testing.T) {
	k, err := nemesisKinds("mixed", false)
	if err != nil || slices.Contains(k, "upgrade") || len(k) != len(faultKinds)-1 {
		t.Fatalf("mixed without an old build: %v %v", k, err)
	}
	if k, _ := nemesisKinds("mixed", true); !slices.Contains(k, "upgrade") {
		t.Fatalf("mixed with an old build: %v", k)
	}
	if k, _ := nemesisKinds("upgrade", false); !slices.Equal(k, []string{"upgrade"}) {
		t.Fatalf("upgrade: %v", k)
	}
}
