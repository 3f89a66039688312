package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/node"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// chimed dev (one node, no gossip) serves the Admin API, and answers a
// request made the moment its gRPC port opens, before its shards have
// elected leaders. Before, `chimectl status` against it failed with
// "Unimplemented: unknown service chime.v1.Admin" and `chimectl schedule`
// right after the start with "Unavailable: shard: not the leader".
func TestDevServesAdminAndWaitsForLeaders(t *testing.T) {
	n, err := node.Start(node.Config{
		NodeID: "dev", DataDir: t.TempDir(), GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0",
		Brokers: broker(t), Shards: 2, Logger: slog.New(slog.DiscardHandler), Now: time.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	cc, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ready := n.Host().Ready()
	if _, err := chimev1.NewSchedulerClient(cc).Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
		Id: "first", Topic: "t", Payload: []byte("p"), Delay: durationpb.New(time.Hour),
	}}); err != nil {
		t.Fatalf("schedule right after the start (shards ready: %v): %v", ready, err)
	}
	if ready {
		t.Log("the shards had leaders before the first request: the wait was not exercised")
	}

	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	admin := chimev1.NewAdminClient(cc)
	st, err := admin.Status(ctx, &chimev1.StatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if len(st.Members) != 1 || st.Members[0].Id != "dev" || st.Members[0].State != "alive" || len(st.Shards) != 2 {
		t.Fatalf("status: %v", st)
	}
	for _, s := range st.Shards {
		if s.Leader != "dev" || len(s.Voters) != 1 || s.Voters[0] != "dev" || len(s.Desired) != 1 {
			t.Errorf("shard %d: leader %q voters %v desired %v; want dev everywhere", s.Id, s.Leader, s.Voters, s.Desired)
		}
	}
	if m, err := admin.GetClusterMap(ctx, &chimev1.GetClusterMapRequest{}); err != nil || len(m.Shards) != 2 || len(m.ClusterId) != 16 {
		t.Fatalf("cluster map: %v, %v", m, err)
	}
	ns, err := admin.NodeStatus(ctx, &chimev1.NodeStatusRequest{Digest: true})
	if err != nil || len(ns.Replicas) != 2 || ns.Replicas[0].RaftState != "Leader" || ns.Replicas[0].Digest == "" {
		t.Fatalf("node status: %v, %v", ns, err)
	}
	if r, err := admin.TransferLeader(ctx, &chimev1.TransferLeaderRequest{Shard: 1, Node: "dev"}); err != nil || r.Leader != "dev" {
		t.Fatalf("transfer-leader to itself: %v, %v", r, err)
	}
	if _, err := admin.Drain(ctx, &chimev1.DrainRequest{Node: "dev"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("drain: %v; want FAILED_PRECONDITION", err)
	} else {
		t.Logf("drain: %v", err)
	}
	if _, err := admin.RemoveNode(ctx, &chimev1.RemoveNodeRequest{Node: "other"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("remove: %v; want FAILED_PRECONDITION", err)
	}
}
