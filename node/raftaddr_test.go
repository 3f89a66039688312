package node

import (
	"strings"
	"testing"

	"github.com/chimehq/chime/membership"
)

// TestRaftAddrConflict: a certificate answering at another member's Raft
// address is refused unless that member vacated it (removed by an operator
// and gone from the shard's configuration), so a replacement that takes a
// removed node's address can catch up, and nothing else can stand in.
func TestRaftAddrConflict(t *testing.T) {
	member := func(addr string, st membership.State) membership.Member {
		return membership.Member{Meta: membership.Meta{RaftAddr: addr}, State: st}
	}
	members := map[string]membership.Member{
		"n1": member("10.0.0.1:7071", membership.Dead),
		"n2": member("10.0.0.2:7071", membership.Alive),
		"n7": member("10.0.0.1:7071", membership.Alive), // took n1's address
	}
	none := func(string) bool { return false }
	n1Gone := func(owner string) bool { return owner == "n1" }
	for _, tc := range []struct {
		name, addr, id string
		vacated        func(string) bool
		refusedFor     string // the owner the refusal names; "" for none
	}{
		{"the advertising node answers", "10.0.0.2:7071", "n2", none, ""},
		{"another live node answers", "10.0.0.2:7071", "n7", none, "n2"},
		{"a replacement at a removed node's address still in the configuration", "10.0.0.1:7071", "n7", none, "n1"},
		{"a replacement at a vacated address", "10.0.0.1:7071", "n7", n1Gone, ""},
		{"the removed node's own certificate at its address", "10.0.0.1:7071", "n1", n1Gone, "n7"},
		{"an address no member advertises", "10.0.0.9:7071", "n2", none, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := raftAddrConflict(members, tc.addr, tc.id, tc.vacated)
			switch {
			case tc.refusedFor == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refusedFor != "" && (err == nil || !strings.Contains(err.Error(), `node "`+tc.refusedFor+`"'s Raft address`)):
				t.Errorf("got %v, want a refusal naming %s's address", err, tc.refusedFor)
			}
		})
	}
}
