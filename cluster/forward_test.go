package cluster

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// TestValidEventsCarryTheOutput: a request forwarded to the shard's leader
// (ValidEvent, over the wire) arrives with its partition (0 told apart from
// none) and tombstone, and a Get answered by the leader (GetResponse) shows
// them on the asking node.
func TestValidEventsCarryTheOutput(t *testing.T) {
	outputs := []raftfsm.Output{{}, {HasPartition: true}, {Partition: 7, HasPartition: true}, {Tombstone: true},
		{Partition: 1, HasPartition: true, Tombstone: true}}
	var reqs []shard.Request
	for i, o := range outputs {
		reqs = append(reqs, shard.Request{ID: string(rune('a' + i)), Topic: "t", HasDelay: true, Delay: time.Second,
			ContentHash: uint64(i), Policy: raftfsm.Policy{Priority: 9, Window: 5}, Output: o})
	}
	wire, err := proto.Marshal(validEvents(3, reqs))
	if err != nil {
		t.Fatal(err)
	}
	var in chimev1.ShardScheduleRequest
	if err := proto.Unmarshal(wire, &in); err != nil {
		t.Fatal(err)
	}
	got := fromValidEvents(in.Events, nil)
	for i := range reqs {
		if !reflect.DeepEqual(got[i], reqs[i]) {
			t.Errorf("forwarded request %d:\n got %+v\nwant %+v", i, got[i], reqs[i])
		}
	}

	for _, o := range outputs {
		rec := raftfsm.Record{ID: "g", State: raftfsm.StateScheduled, Due: 1e18, CreatedAt: 1e17, Topic: "t",
			Version: 1, Policy: raftfsm.DefaultPolicy, Output: o}
		g, err := GetResponse(&rec)
		if err != nil {
			t.Fatal(err)
		}
		wire, err := proto.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		var back chimev1.GetResponse
		if err := proto.Unmarshal(wire, &back); err != nil {
			t.Fatal(err)
		}
		if (back.Event.Partition != nil) != o.HasPartition || back.Event.GetPartition() != o.Partition || back.Event.Tombstone != o.Tombstone {
			t.Errorf("GetResponse of output %+v: partition %v, tombstone %v", o, back.Event.Partition, back.Event.Tombstone)
		}
		if r := fromGetResponse(&back); r.Output != o {
			t.Errorf("fromGetResponse of output %+v: %+v", o, r.Output)
		}
	}
}
