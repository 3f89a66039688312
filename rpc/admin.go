package rpc

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/membership"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Admin implements chime.v1.Admin over a Cluster. Calls about another node
// or shard are forwarded to it; Status gathers every live member's replicas.
type Admin struct {
	chimev1.UnimplementedAdminServer
	c *Cluster
}

// RegisterAdmin registers the Admin service for c on gs.
func RegisterAdmin(gs *grpc.Server, c *Cluster) {
	chimev1.RegisterAdminServer(gs, &Admin{c: c})
}

// statusFanout bounds how long Status waits for one member.
const statusFanout = 2 * time.Second

func (a *Admin) NodeStatus(_ context.Context, req *chimev1.NodeStatusRequest) (*chimev1.NodeStatusResponse, error) {
	st := a.c.localStatus()
	if req.Digest {
		h := a.c.host.Load()
		for _, r := range st.Replicas {
			s := h.Replica(r.Shard)
			if s == nil {
				continue
			}
			idx, d, err := s.Digest()
			if err != nil {
				return nil, statusOf(a.c.logger, "digest", err)
			}
			r.DigestIndex, r.Digest = idx, fmt.Sprintf("%016x", d)
		}
	}
	return st, nil
}

func (a *Admin) GetClusterMap(ctx context.Context, _ *chimev1.GetClusterMapRequest) (*chimev1.ClusterMap, error) {
	st, err := a.Status(ctx, &chimev1.StatusRequest{})
	if err != nil {
		return nil, err
	}
	m := &chimev1.ClusterMap{ShardCount: st.ShardCount, Replication: st.Replication, Members: st.Members}
	for _, s := range st.Shards {
		m.Shards = append(m.Shards, &chimev1.Shard{Id: s.Id, Leader: s.Leader, Voters: s.Voters, Nonvoters: s.Nonvoters, Desired: s.Desired})
	}
	return m, nil
}

func (a *Admin) Status(ctx context.Context, _ *chimev1.StatusRequest) (*chimev1.StatusResponse, error) {
	c := a.c
	c.mu.RLock()
	view := c.view
	c.mu.RUnlock()
	resp := &chimev1.StatusResponse{ShardCount: uint32(c.shards), Replication: uint32(c.replication)}
	ids := make([]string, 0, len(view.Members))
	for id := range view.Members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		resp.Members = append(resp.Members, memberProto(view.Members[id], c.Removed(id)))
	}
	// Every live member's replicas, gathered in parallel.
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		replicas = map[string]*chimev1.NodeStatusResponse{}
	)
	for _, id := range view.Live() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, statusFanout)
			defer cancel()
			st, err := c.nodeStatus(ctx, id)
			if err != nil {
				return
			}
			mu.Lock()
			replicas[id] = st
			mu.Unlock()
		}()
	}
	wg.Wait()
	for s := range c.shards {
		sh := &chimev1.Shard{Id: uint32(s), Desired: c.Desired(uint32(s))}
		var best *chimev1.Replica // the leader's replica, else the most advanced one
		for _, st := range replicas {
			for _, r := range st.Replicas {
				if r.Shard != uint32(s) {
					continue
				}
				if r.RaftState == "Leader" {
					sh.Leader = st.NodeId
					best = r
				} else if best == nil || (best.RaftState != "Leader" && r.AppliedIndex > best.AppliedIndex) {
					best = r
				}
			}
		}
		if best != nil {
			sh.Voters, sh.Nonvoters = best.Voters, best.Nonvoters
			sh.AppliedIndex, sh.Pending, sh.Fired = best.AppliedIndex, best.Pending, best.Fired
			sh.Cancelled, sh.DeadLettered, sh.Refired = best.Cancelled, best.DeadLettered, best.Refired
		}
		resp.Shards = append(resp.Shards, sh)
	}
	return resp, nil
}

func memberProto(m membership.Member, removed bool) *chimev1.Member {
	state := m.State.String()
	switch {
	case removed:
		state = "removed"
	case m.Meta.Draining && m.State.Live():
		state = "draining"
	}
	return &chimev1.Member{
		Id: m.Meta.NodeID, State: state, GrpcAddr: m.Meta.GRPCAddr, RaftAddr: m.Meta.RaftAddr,
		GossipAddr: m.GossipAddr, HttpAddr: m.Meta.HTTPAddr, Since: timestamppb.New(m.Since),
	}
}

func (a *Admin) adminClient(node string) (chimev1.AdminClient, error) {
	cc, err := a.c.conn(node)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "node: %q is not a known member", node)
	}
	return chimev1.NewAdminClient(cc), nil
}

func (a *Admin) Drain(ctx context.Context, req *chimev1.DrainRequest) (*chimev1.DrainResponse, error) {
	if req.Node == "" {
		return nil, status.Error(codes.InvalidArgument, "node: required")
	}
	if req.Node != a.c.self {
		if forwarded(ctx) {
			return nil, status.Errorf(codes.Unavailable, "node: %q is not this node", req.Node)
		}
		cl, err := a.adminClient(req.Node)
		if err != nil {
			return nil, err
		}
		return cl.Drain(forwardCtx(ctx), req)
	}
	if err := a.c.ml.SetDraining(true); err != nil {
		return nil, status.Errorf(codes.Internal, "gossiping the draining state: %v", err)
	}
	a.c.refresh()
	st, err := a.Status(ctx, &chimev1.StatusRequest{})
	if err != nil {
		return nil, err
	}
	resp := &chimev1.DrainResponse{Node: req.Node}
	for _, s := range st.Shards {
		if slices.Contains(s.Voters, req.Node) || slices.Contains(s.Nonvoters, req.Node) {
			resp.ReplicasRemaining++
		}
		if s.Leader == req.Node {
			resp.LeadersRemaining++
		}
	}
	// Only this node's own replica list tells whether it still holds data.
	local := a.c.localStatus()
	resp.SafeToStop = resp.ReplicasRemaining == 0 && resp.LeadersRemaining == 0 && len(local.Replicas) == 0
	return resp, nil
}

func (a *Admin) TransferLeader(ctx context.Context, req *chimev1.TransferLeaderRequest) (*chimev1.TransferLeaderResponse, error) {
	c := a.c
	if int(req.Shard) >= c.shards {
		return nil, status.Errorf(codes.InvalidArgument, "shard: %d is out of range (the cluster has %d shards)", req.Shard, c.shards)
	}
	if req.Node == "" {
		return nil, status.Error(codes.InvalidArgument, "node: required")
	}
	addr, ok := c.RaftAddr(req.Node)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "node: %q is not a known member", req.Node)
	}
	if r := c.local(req.Shard); r != nil {
		voters, _, err := r.Configuration()
		if err != nil {
			return nil, statusOf(a.c.logger, "admin", err)
		}
		if !slices.Contains(voters, req.Node) {
			return nil, status.Errorf(codes.FailedPrecondition, "node: %q is not a voter of shard %d (voters: %v)", req.Node, req.Shard, voters)
		}
		if req.Node != c.self {
			if err := r.TransferLeadership(req.Node, addr); err != nil {
				return nil, status.Errorf(codes.Aborted, "transfer of shard %d to %s: %v", req.Shard, req.Node, err)
			}
		}
		// The old leader has stepped down; report the new one once this
		// replica hears from it.
		deadline := time.Now().Add(3 * time.Second)
		for r.Leader() == "" && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		return &chimev1.TransferLeaderResponse{Leader: r.Leader()}, nil
	}
	if forwarded(ctx) {
		return nil, status.Errorf(codes.Unavailable, "shard %d: this node no longer leads it; retry", req.Shard)
	}
	leader, err := c.leaderNode(ctx, req.Shard)
	if err != nil {
		return nil, statusOf(a.c.logger, "admin", err)
	}
	cl, err := a.adminClient(leader)
	if err != nil {
		return nil, err
	}
	return cl.TransferLeader(forwardCtx(ctx), req)
}

func (a *Admin) RemoveNode(ctx context.Context, req *chimev1.RemoveNodeRequest) (*chimev1.RemoveNodeResponse, error) {
	c := a.c
	if req.Node == "" {
		return nil, status.Error(codes.InvalidArgument, "node: required")
	}
	if req.Node == c.self {
		return nil, status.Error(codes.FailedPrecondition, "node: cannot remove the node that answers; ask another node")
	}
	m, ok := c.member(req.Node)
	if !ok && !c.Removed(req.Node) {
		return nil, status.Errorf(codes.NotFound, "node: %q is not a known member", req.Node)
	}
	if ok && m.State.Live() {
		return nil, status.Errorf(codes.FailedPrecondition, "node: %q is %s; drain it instead (chimectl drain %s), or stop it first", req.Node, m.State, req.Node)
	}
	resp := &chimev1.RemoveNodeResponse{}
	if !forwarded(ctx) {
		st, err := a.Status(ctx, &chimev1.StatusRequest{})
		if err == nil {
			for _, s := range st.Shards {
				if slices.Contains(s.Voters, req.Node) {
					resp.ShardsChanged++
				}
			}
		}
		// Every live member forgets the node, so whichever leads a shard
		// drops it; a member that misses this keeps the node until it is
		// told again.
		for _, id := range c.liveMembers() {
			if id == c.self {
				continue
			}
			cl, err := a.adminClient(id)
			if err != nil {
				continue
			}
			fctx, cancel := context.WithTimeout(forwardCtx(ctx), statusFanout)
			if _, err := cl.RemoveNode(fctx, req); err != nil {
				c.logger.Warn("telling a member to forget a removed node", "member", id, "node", req.Node, "err", err)
			}
			cancel()
		}
	}
	if err := c.Remove(req.Node); err != nil {
		return nil, status.Errorf(codes.Internal, "recording the removal: %v", err)
	}
	return resp, nil
}
