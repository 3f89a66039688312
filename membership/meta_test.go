package membership

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
)

func TestMetaRoundTrip(t *testing.T) {
	in := Meta{
		NodeID: "node-1", GRPCAddr: "10.0.0.1:7400", RaftAddr: "10.0.0.1:7401", HTTPAddr: "10.0.0.1:7402",
		Draining: true, ClusterID: "c-7f3a", Shards: 64, Replication: 3,
	}
	for _, draining := range []bool{false, true} {
		in.Draining = draining
		b, err := encodeMeta(in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := decodeMeta(b)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if out != in {
			t.Fatalf("round trip of %+v gave %+v (wire %s)", in, out, b)
		}
	}
}

func TestMetaNeedsNodeID(t *testing.T) {
	_, err := Start(Config{Meta: Meta{RaftAddr: "127.0.0.1:1"}, BindAddr: "127.0.0.1:0", Logger: quietLogger()})
	if err == nil || !strings.Contains(err.Error(), "NodeID") {
		t.Fatalf("Start without NodeID: got %v, want an error naming NodeID", err)
	}
}

// TestMetaTooLarge: Start refuses metadata that would not fit memberlist's
// 512-byte limit with Draining set, so SetDraining can never push an accepted
// meta over it later.
func TestMetaTooLarge(t *testing.T) {
	big := Meta{NodeID: "n1", RaftAddr: strings.Repeat("r", 600)}
	_, err := Start(Config{Meta: big, BindAddr: "127.0.0.1:0", Logger: quietLogger()})
	if !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("Start with a 600-byte RaftAddr: got %v, want ErrMetaTooLarge", err)
	}
	if !strings.Contains(err.Error(), "limit 512") {
		t.Errorf("error %q does not state the limit", err)
	}

	// Find the longest NodeID that is accepted: once draining, its encoding
	// must be exactly the limit, and one byte more must be refused.
	base := Meta{GRPCAddr: "10.0.0.1:7400", RaftAddr: "10.0.0.1:7401", ClusterID: "c", Shards: 64, Replication: 3}
	longest := 0
	for n := 1; n <= memberlist.MetaMaxSize; n++ {
		m := base
		m.NodeID = strings.Repeat("x", n)
		if _, err := encodeMeta(m); err != nil {
			if !errors.Is(err, ErrMetaTooLarge) {
				t.Fatalf("NodeID of %d bytes: unexpected error %v", n, err)
			}
			break
		}
		longest = n
	}
	m := base
	m.NodeID = strings.Repeat("x", longest)
	m.Draining = true
	worst, err := encodeMeta(m)
	if err != nil {
		t.Fatalf("longest accepted meta rejected once draining: %v", err)
	}
	if len(worst) != memberlist.MetaMaxSize {
		t.Fatalf("longest accepted meta encodes to %d bytes draining, want exactly %d", len(worst), memberlist.MetaMaxSize)
	}
}
