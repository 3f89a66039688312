package node

import (
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/membership"
	"github.com/chimehq/chime/shard/raftmux"
)

// TestDialledRefusal: a dial raft bound to a node takes that node's
// certificate alone, whoever advertises the address now, so a replacement
// given a removed node's address takes its own replication and never the
// removed node's; a bare address must not be another member's.
func TestDialledRefusal(t *testing.T) {
	member := func(addr string, st membership.State) membership.Member {
		return membership.Member{Meta: membership.Meta{RaftAddr: addr}, State: st}
	}
	members := map[string]membership.Member{
		"n1": member("10.0.0.1:7071", membership.Dead), // removed; n7 took its address
		"n2": member("10.0.0.2:7071", membership.Alive),
		"n7": member("10.0.0.1:7071", membership.Alive),
	}
	bound := func(node, addr string) string {
		return string(raftmux.Bind(raft.ServerID("n"+node), raft.ServerAddress(addr)))
	}
	for _, tc := range []struct {
		name, addr, id string
		refused        string // what the refusal says; "" for none
	}{
		{"the node meant answers", bound("7", "10.0.0.1:7071"), "n7", ""},
		{"the replacement answers a dial meant for the removed node", bound("1", "10.0.0.1:7071"), "n7",
			`node "n1" was dialled at 10.0.0.1:7071, but the certificate there is node "n7"'s`},
		{"another live node answers", bound("2", "10.0.0.2:7071"), "n7", `node "n2" was dialled`},
		{"a bare address, its advertiser answering", "10.0.0.2:7071", "n2", ""},
		{"a bare address, another node answering", "10.0.0.2:7071", "n7", `10.0.0.2:7071 is node "n2"'s Raft address`},
		{"a bare address no member advertises", "10.0.0.9:7071", "n2", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := dialledRefusal(members, tc.addr, tc.id)
			switch {
			case tc.refused == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Errorf("got %v, want a refusal saying %q", err, tc.refused)
			}
		})
	}
}
