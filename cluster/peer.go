package cluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// RegisterPeer serves chime.v1.Peer for c on gs: the questions other nodes
// ask this one.
func RegisterPeer(gs *grpc.Server, c *Cluster) {
	chimev1.RegisterPeerServer(gs, peerServer{c: c})
}

type peerServer struct {
	chimev1.UnimplementedPeerServer
	c *Cluster
}

func (p peerServer) Replicas(_ context.Context, req *chimev1.ReplicasRequest) (*chimev1.ReplicasResponse, error) {
	return p.c.LocalReplicas(req.Shards...), nil
}

func (p peerServer) Forget(_ context.Context, req *chimev1.ForgetRequest) (*chimev1.ForgetResponse, error) {
	c := p.c
	switch m, ok := c.Member(req.Node); {
	case req.Node == "":
		return nil, status.Error(codes.InvalidArgument, "node: required")
	case req.Node == c.self:
		return nil, status.Error(codes.FailedPrecondition, "node: this node cannot forget itself")
	case ok && m.State.Live():
		return nil, status.Errorf(codes.FailedPrecondition, "node: %q is %s as this node sees it", req.Node, m.State)
	}
	if err := c.Remove(req.Node); err != nil {
		return nil, status.Errorf(codes.Internal, "recording the removal: %v", err)
	}
	return &chimev1.ForgetResponse{}, nil
}

func (p peerServer) ShardParked(_ context.Context, req *chimev1.ShardParkedRequest) (*chimev1.ShardParkedResponse, error) {
	r, err := p.replica(req.Shard)
	if err != nil {
		return nil, err
	}
	parked := r.Parked()
	resp := &chimev1.ShardParkedResponse{Events: make([]*chimev1.ParkedEvent, len(parked))}
	for i, e := range parked {
		resp.Events[i] = &chimev1.ParkedEvent{Seq: e.Seq, FiredAt: e.FiredAt, Attempts: e.Attempts, Due: e.Due}
	}
	return resp, nil
}

// peerWait bounds how long a question to one other node waits.
const peerWait = 2 * time.Second

// NodeReplicas asks node (this one included) for its replicas of shards,
// or all of them when none are named.
func (c *Cluster) NodeReplicas(ctx context.Context, node string, shards ...uint32) (*chimev1.ReplicasResponse, error) {
	if node == c.self {
		return c.LocalReplicas(shards...), nil
	}
	cc, err := c.Conn(node)
	if err != nil {
		return nil, err
	}
	return chimev1.NewPeerClient(cc).Replicas(ctx, &chimev1.ReplicasRequest{Shards: shards})
}

// AllReplicas asks every live member, in parallel and for at most
// peerWait each, for its replicas. Members that do not answer are left out.
func (c *Cluster) AllReplicas(ctx context.Context) map[string]*chimev1.ReplicasResponse {
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = map[string]*chimev1.ReplicasResponse{}
	)
	for _, id := range c.liveMembers() {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, peerWait)
			defer cancel()
			st, err := c.NodeReplicas(ctx, id)
			if err != nil {
				return
			}
			mu.Lock()
			out[id] = st
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// ForgetEverywhere tells every other live member to forget node, so that
// whichever leads a shard drops it, and waits for their answers (each
// bounded by peerWait). Each member records the removal on its disk before
// it answers. A member that misses this, or was not live then, is told
// again by every member that records the removal (Cluster.tellRemoved).
func (c *Cluster) ForgetEverywhere(ctx context.Context, node string) {
	for _, id := range c.liveMembers() {
		if id == c.self {
			continue
		}
		if err := c.forget(ctx, id, node); err != nil {
			c.logger.Warn("telling a member to forget a removed node", "member", id, "node", node, "err", err)
		}
	}
}

// forget asks member's Peer service to forget node, for at most peerWait.
func (c *Cluster) forget(ctx context.Context, member, node string) error {
	cc, err := c.Conn(member)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, peerWait)
	defer cancel()
	_, err = chimev1.NewPeerClient(cc).Forget(ctx, &chimev1.ForgetRequest{Node: node})
	return err
}

// LocalReplicas describes this node's replicas of shards, or all of them.
func (c *Cluster) LocalReplicas(shards ...uint32) *chimev1.ReplicasResponse {
	resp := &chimev1.ReplicasResponse{NodeId: c.self}
	if m, ok := c.Member(c.self); ok {
		resp.Draining = m.Meta.Draining
	}
	if f := c.ingest.Load(); f != nil {
		resp.Ingest = (*f)()
	}
	h := c.host.Load()
	if h == nil {
		return resp
	}
	for id, s := range h.Shards() {
		if len(shards) > 0 && !slices.Contains(shards, id) {
			continue
		}
		if r, err := ReplicaStatus(s); err == nil {
			resp.Replicas = append(resp.Replicas, r)
		}
	}
	slices.SortFunc(resp.Replicas, func(a, b *chimev1.ReplicaStatus) int { return int(a.Shard) - int(b.Shard) })
	return resp
}

// ReplicaStatus is s's typed status as the Peer service sends it.
func ReplicaStatus(s *shard.Shard) (*chimev1.ReplicaStatus, error) {
	rs, err := s.Status()
	if err != nil {
		return nil, err
	}
	st := s.Stats()
	return &chimev1.ReplicaStatus{
		Shard: s.ID(), State: raftState(rs.State), Leader: rs.Leader, Voters: rs.Voters, Nonvoters: rs.Nonvoters,
		LastIndex: rs.LastIndex, AppliedIndex: rs.AppliedIndex, CommitIndex: rs.CommitIndex, Term: rs.Term,
		Pending: st.Pending, Fired: st.Fired, Cancelled: st.Cancelled, DeadLettered: st.DeadLettered, Refired: st.Refired,
	}, nil
}

func raftState(s raft.RaftState) chimev1.RaftState {
	switch s {
	case raft.Follower:
		return chimev1.RaftState_RAFT_STATE_FOLLOWER
	case raft.Candidate:
		return chimev1.RaftState_RAFT_STATE_CANDIDATE
	case raft.Leader:
		return chimev1.RaftState_RAFT_STATE_LEADER
	case raft.Shutdown:
		return chimev1.RaftState_RAFT_STATE_SHUTDOWN
	}
	return chimev1.RaftState_RAFT_STATE_UNSPECIFIED
}

// leaderReplica finds the shard's leader: this node's replica when it leads,
// otherwise by asking the shard's likely holders, then every live member.
func (c *Cluster) leaderReplica(ctx context.Context, s uint32) (*chimev1.ReplicaStatus, string, error) {
	order := slices.Clone(c.Desired(s))
	if h := c.host.Load(); h != nil {
		if r := h.Replica(s); r != nil {
			if r.IsLeader() {
				if st, err := ReplicaStatus(r); err == nil {
					return st, c.self, nil
				}
			} else if l := r.Leader(); l != "" {
				order = append([]string{l}, order...)
			}
		}
	}
	asked := map[string]bool{c.self: true}
	order = append(order, c.liveMembers()...)
	for _, n := range order {
		if asked[n] {
			continue
		}
		asked[n] = true
		st, err := c.NodeReplicas(ctx, n, s)
		if err != nil {
			continue
		}
		for _, r := range st.Replicas {
			if r.Shard == s && r.State == chimev1.RaftState_RAFT_STATE_LEADER {
				return r, n, nil
			}
		}
	}
	return nil, "", fmt.Errorf("%w: no leader found for shard %d", shard.ErrNotLeader, s)
}

// LeaderNode returns the node that leads shard s as far as this node can
// tell, or an error wrapping shard.ErrNotLeader.
func (c *Cluster) LeaderNode(ctx context.Context, s uint32) (string, error) {
	if h := c.host.Load(); h != nil {
		if r := h.Replica(s); r != nil {
			if l := r.Leader(); l != "" {
				return l, nil
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, peerWait)
	defer cancel()
	_, node, err := c.leaderReplica(ctx, s)
	return node, err
}

// LocalLeader returns this node's replica of s when it leads it.
func (c *Cluster) LocalLeader(s uint32) *shard.Shard {
	if h := c.host.Load(); h != nil {
		if r := h.Replica(s); r != nil && r.IsLeader() {
			return r
		}
	}
	return nil
}

// replica is this node's replica of shard s, for a Peer call about it.
func (p peerServer) replica(s uint32) (*shard.Shard, error) {
	var r *shard.Shard
	if h := p.c.host.Load(); h != nil {
		r = h.Replica(s)
	}
	if r == nil {
		return nil, StatusOf(p.c.logger, "Peer", fmt.Errorf("%w: shard %d has no replica on node %s", shard.ErrUnknownShard, s, p.c.self))
	}
	return r, nil
}

// scope is what the credential a Peer call was made for may act on.
func (p peerServer) scope(ctx context.Context) shard.Scope {
	if p.c.scopeOf == nil {
		return nil
	}
	return p.c.scopeOf(ctx)
}

// ShardSchedule proposes the events another node validated, on this node's
// replica, as they are.
func (p peerServer) ShardSchedule(ctx context.Context, req *chimev1.ShardScheduleRequest) (*chimev1.ShardScheduleResponse, error) {
	r, err := p.replica(req.Shard)
	if err != nil {
		return nil, err
	}
	res, err := r.Schedule(ctx, fromValidEvents(req.Events, p.scope(ctx)))
	if err != nil {
		return nil, StatusOf(p.c.logger, "Schedule", err)
	}
	return &chimev1.ShardScheduleResponse{Results: shardResults(p.c.logger, res)}, nil
}

func (p peerServer) ShardUpdate(ctx context.Context, req *chimev1.ShardUpdateRequest) (*chimev1.ShardUpdateResponse, error) {
	r, err := p.replica(shard.For(req.Id, p.c.shards))
	if err != nil {
		return nil, err
	}
	res, err := r.Update(ctx, change(req, p.scope(ctx)))
	if err != nil {
		return nil, StatusOf(p.c.logger, "Update", err)
	}
	return &chimev1.ShardUpdateResponse{Outcome: uint32(res.Outcome), State: uint32(res.State), Due: res.Due, Version: res.Version}, nil
}

func (p peerServer) ShardCancelEvent(ctx context.Context, req *chimev1.ShardEventRequest) (*chimev1.ShardCancelEventResponse, error) {
	r, err := p.replica(shard.For(req.Id, p.c.shards))
	if err != nil {
		return nil, err
	}
	res, err := r.Cancel(ctx, req.Id, p.scope(ctx))
	if err != nil {
		return nil, StatusOf(p.c.logger, "Cancel", err)
	}
	return &chimev1.ShardCancelEventResponse{Outcome: uint32(res.Outcome)}, nil
}

func (p peerServer) ShardGet(ctx context.Context, req *chimev1.ShardEventRequest) (*chimev1.ShardGetResponse, error) {
	r, err := p.replica(shard.For(req.Id, p.c.shards))
	if err != nil {
		return nil, err
	}
	rec, ok, err := r.Get(ctx, req.Id)
	if err != nil {
		return nil, StatusOf(p.c.logger, "Get", err)
	}
	if !ok {
		return &chimev1.ShardGetResponse{}, nil
	}
	g, err := GetResponse(&rec)
	if err != nil {
		return nil, StatusOf(p.c.logger, "Get", err)
	}
	return &chimev1.ShardGetResponse{Found: true, Event: g}, nil
}

func (p peerServer) ShardRecurring(ctx context.Context, req *chimev1.ShardRecurringRequest) (*chimev1.ShardRecurringResponse, error) {
	cmd, err := raftfsm.DecodeCommand(req.Command)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "command: %v", err)
	}
	rc, ok := cmd.(*raftfsm.Recurring)
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "command: a %v, not a recurring-schedule command", cmd.Type())
	}
	r, err := p.replica(shard.For(rc.ID, p.c.shards))
	if err != nil {
		return nil, err
	}
	res, err := r.Recurring(ctx, *rc, p.scope(ctx))
	if err != nil {
		return nil, StatusOf(p.c.logger, "Recurring", err)
	}
	resp := &chimev1.ShardRecurringResponse{Outcome: uint32(res.Outcome), Error: res.Error,
		Created: res.Created, Existing: res.Existing, Due: res.Due}
	if res.Schedule.ID != "" {
		resp.Schedule = ScheduleProto(&res.Schedule)
	}
	return resp, nil
}
