package cluster

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
)

// earlierPeer is the Peer service of a release before priorities: it serves
// ShardList, ShardCount and ShardCancel, ignoring the filter's priorities,
// and no V2 names.
type earlierPeer struct {
	chimev1.UnimplementedPeerServer
	mu    sync.Mutex
	calls []string
}

func (p *earlierPeer) called(m string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, m)
}

func (p *earlierPeer) ShardList(context.Context, *chimev1.ShardQuery) (*chimev1.ShardListResponse, error) {
	p.called("ShardList")
	return &chimev1.ShardListResponse{}, nil
}

func (p *earlierPeer) ShardCount(context.Context, *chimev1.ShardQuery) (*chimev1.CountResponse, error) {
	p.called("ShardCount")
	return &chimev1.CountResponse{Count: 7}, nil
}

func (p *earlierPeer) ShardCancel(context.Context, *chimev1.ShardQuery) (*chimev1.ShardCancelResponse, error) {
	p.called("ShardCancel")
	return &chimev1.ShardCancelResponse{Step: &chimev1.CancelMatchingProgress{Matched: 7, Cancelled: 7}}, nil
}

// TestQueryByPriorityRefusedByAnEarlierRelease: a shard query by priority
// goes to the leader under the V2 names, which a node of an earlier release
// does not serve, so it acts on nothing and the asking node reports
// FAILED_PRECONDITION naming the field; a query without priorities keeps
// the names every release serves.
func TestQueryByPriorityRefusedByAnEarlierRelease(t *testing.T) {
	desc := chimev1.Peer_ServiceDesc
	desc.Methods = slices.DeleteFunc(slices.Clone(desc.Methods), func(m grpc.MethodDesc) bool { return strings.HasSuffix(m.MethodName, "V2") })
	if len(desc.Methods) != len(chimev1.Peer_ServiceDesc.Methods)-3 {
		t.Fatalf("the Peer service has %d methods, %d without the V2 names; want 3 fewer", len(chimev1.Peer_ServiceDesc.Methods), len(desc.Methods))
	}
	old := &earlierPeer{}
	gs := grpc.NewServer()
	gs.RegisterService(&desc, old)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(ln) }()
	defer func() { gs.Stop(); <-served }()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	p := chimev1.NewPeerClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	plain := raftfsm.Query{Topic: "payments", Due: raftfsm.AnyDue}
	byPriority := plain
	byPriority.Priorities = raftfsm.PrioritiesOf(9)
	if q, err := FilterQuery(Filter(byPriority)); err != nil || q != byPriority {
		t.Fatalf("FilterQuery(Filter(%+v)) = %+v, %v", byPriority, q, err)
	}

	refused := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "filter.priorities: the leader of shard 3 runs an earlier release") {
			t.Errorf("%s by priority on an earlier release: %v; want FAILED_PRECONDITION naming filter.priorities", what, err)
		}
	}
	_, err = shardCall(ctx, shardQuery(3, byPriority, nil, 10, false), p.ShardList, p.ShardListV2)
	refused("ShardList", err)
	_, err = shardCall(ctx, shardQuery(3, byPriority, nil, 0, false), p.ShardCount, p.ShardCountV2)
	refused("ShardCount", err)
	_, err = shardCall(ctx, shardQuery(3, byPriority, nil, CancelStepSize, false), p.ShardCancel, p.ShardCancelV2)
	refused("ShardCancel", err)
	if len(old.calls) != 0 {
		t.Fatalf("the earlier release was asked %v for a query by priority", old.calls)
	}

	if _, err := shardCall(ctx, shardQuery(3, plain, nil, 10, false), p.ShardList, p.ShardListV2); err != nil {
		t.Errorf("ShardList without priorities: %v", err)
	}
	if resp, err := shardCall(ctx, shardQuery(3, plain, nil, 0, false), p.ShardCount, p.ShardCountV2); err != nil || resp.Count != 7 {
		t.Errorf("ShardCount without priorities: %v, %v", resp, err)
	}
	if resp, err := shardCall(ctx, shardQuery(3, plain, nil, CancelStepSize, false), p.ShardCancel, p.ShardCancelV2); err != nil || resp.Step.GetCancelled() != 7 {
		t.Errorf("ShardCancel without priorities: %v, %v", resp, err)
	}
	if want := []string{"ShardList", "ShardCount", "ShardCancel"}; !slices.Equal(old.calls, want) {
		t.Errorf("the earlier release was asked %v, want %v", old.calls, want)
	}
}
