package node

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/chimehq/chime/membership"
)

// FuzzClusterMeta: cluster.json is read at every start, and fixes the node's id, shard
// count, replication and retention. decodeMeta never panics; what it accepts is a directory
// Start can run on (an id, a shard count the host and the placement can size things by, no
// negative replication or retention), and saveMeta writes it back as bytes that decode to
// the same values.
func FuzzClusterMeta(f *testing.F) {
	for _, m := range []clusterMeta{
		{ClusterID: "3f9a6c0de1b24a77", Shards: 8, Replication: 3, Retention: 7 * 24 * time.Hour, NodeID: "node-1",
			Created: time.Date(2026, 11, 1, 12, 0, 0, 5, time.UTC)},
		{Shards: 3, Replication: 1, NodeID: "dev", RaftAddr: "10.0.0.1:7071", RestoredFrom: "/backups/b1",
			Created: time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)},
	} {
		b, _ := json.MarshalIndent(m, "", "  ")
		f.Add(b)
	}
	f.Add([]byte(`{"shards":8,"node_id":"n"}`))
	// A negative shard count: Start panicked sizing the placement (membership.Placement).
	f.Add([]byte(`{"shards":-1,"node_id":"n"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		if m.NodeID == "" || m.Shards < 1 || m.Shards > membership.MaxShards || m.Replication < 0 || m.Retention < 0 {
			t.Fatalf("%q decodes to %+v, which no node can start on", b, m)
		}
		again, _ := json.MarshalIndent(m, "", "  ")
		d, err := decodeMeta(again)
		if err != nil || !d.Created.Equal(m.Created) {
			t.Fatalf("%q decodes to %+v; written back, to %+v, %v", b, m, d, err)
		}
		d.Created, m.Created = time.Time{}, time.Time{}
		if d != m {
			t.Fatalf("%q decodes to %+v; written back, to %+v", b, m, d)
		}
	})
}

// FuzzPeersFile: peers.json is read at a restart, to reach the members again without
// --join. decodePeers never panics (it is best effort: nothing at all is a start that needs
// --join); it returns either the whole list or nothing, never an empty address; and what the
// cluster writes (a list of gossip addresses) reads back whole.
func FuzzPeersFile(f *testing.F) {
	f.Add([]byte(`["10.0.0.2:7946","10.0.0.3:7946"]`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`["10.0.0.2:7946",1,"10.0.0.3:7946"]`)) // decoded as far as it could: ["10.0.0.2:7946", "", …]
	f.Fuzz(func(t *testing.T, b []byte) {
		peers := decodePeers(b)
		var all []string
		if json.Unmarshal(b, &all) != nil && peers != nil {
			t.Fatalf("%q does not decode, and gives peers %q", b, peers)
		}
		if slices.Contains(peers, "") {
			t.Fatalf("%q gives an empty peer address: %q", b, peers)
		}
		if !slices.Contains(all, "") {
			again, _ := json.Marshal(all)
			if got := decodePeers(again); !slices.Equal(got, all) {
				t.Fatalf("%q written back decodes to %q, want %q", again, got, all)
			}
		}
	})
}
