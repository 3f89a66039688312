package rpc

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/cluster"
	"github.com/chimehq/chime/membership"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/topiclimit"
)

// Admin implements chime.v1.Admin over a cluster.Cluster. Calls about another
// node or shard are forwarded to it through the Admin API; Status gathers
// every live member's replicas through the Peer service. On a Cluster alone
// (chimed dev) every call answers for the one node, and Drain and RemoveNode
// fail with FAILED_PRECONDITION.
type Admin struct {
	chimev1.UnimplementedAdminServer
	c      *cluster.Cluster
	limits *topiclimit.Table
	logger *slog.Logger
}

// RegisterAdmin registers the Admin service for c on gs; limits are the
// node's topic rate limits, which SetTopicRateLimits changes. logger
// receives the errors reported as INTERNAL (nil: slog.Default()).
func RegisterAdmin(gs *grpc.Server, c *cluster.Cluster, limits *topiclimit.Table, logger *slog.Logger) {
	if logger == nil {
		logger = slog.Default()
	}
	if limits == nil {
		limits = topiclimit.NewTable(nil)
	}
	chimev1.RegisterAdminServer(gs, &Admin{c: c, limits: limits, logger: logger})
}

// transferWait bounds how long TransferLeader waits for the old leader's
// replica to hear from the new one.
const transferWait = 3 * time.Second

func (a *Admin) NodeStatus(_ context.Context, req *chimev1.NodeStatusRequest) (*chimev1.NodeStatusResponse, error) {
	local := a.c.LocalReplicas()
	st := &chimev1.NodeStatusResponse{NodeId: local.NodeId, Draining: local.Draining}
	h := a.c.Host()
	for _, r := range local.Replicas {
		rp := replicaProto(r)
		st.Replicas = append(st.Replicas, rp)
		if !req.Digest {
			continue
		}
		s := h.Replica(r.Shard)
		if s == nil {
			continue
		}
		idx, d, err := s.Digest()
		if err != nil {
			return nil, cluster.StatusOf(a.logger, "digest", err)
		}
		rp.DigestIndex, rp.Digest = idx, fmt.Sprintf("%016x", d)
	}
	return st, nil
}

// replicaProto is the operator API's view of a replica's status; the Raft
// state is raft's name for it (Leader, Follower, Candidate, Shutdown).
func replicaProto(r *chimev1.ReplicaStatus) *chimev1.Replica {
	state := map[chimev1.RaftState]string{
		chimev1.RaftState_RAFT_STATE_FOLLOWER: "Follower", chimev1.RaftState_RAFT_STATE_CANDIDATE: "Candidate",
		chimev1.RaftState_RAFT_STATE_LEADER: "Leader", chimev1.RaftState_RAFT_STATE_SHUTDOWN: "Shutdown",
	}[r.State]
	return &chimev1.Replica{
		Shard: r.Shard, RaftState: state, Leader: r.Leader, Voters: r.Voters, Nonvoters: r.Nonvoters,
		AppliedIndex: r.AppliedIndex, LastLogIndex: r.LastIndex, CommitIndex: r.CommitIndex, Term: r.Term,
		Pending: r.Pending, Fired: r.Fired, Cancelled: r.Cancelled, DeadLettered: r.DeadLettered, Refired: r.Refired,
	}
}

func (a *Admin) GetClusterMap(ctx context.Context, _ *chimev1.GetClusterMapRequest) (*chimev1.ClusterMap, error) {
	st, err := a.Status(ctx, &chimev1.StatusRequest{})
	if err != nil {
		return nil, err
	}
	m := &chimev1.ClusterMap{ShardCount: st.ShardCount, Replication: st.Replication, Members: st.Members,
		Retention: durationpb.New(a.c.Retention()), ClusterId: a.c.ID()}
	for _, s := range st.Shards {
		m.Shards = append(m.Shards, &chimev1.Shard{Id: s.Id, Leader: s.Leader, Voters: s.Voters, Nonvoters: s.Nonvoters, Desired: s.Desired})
	}
	return m, nil
}

func (a *Admin) Status(ctx context.Context, _ *chimev1.StatusRequest) (*chimev1.StatusResponse, error) {
	c := a.c
	view := c.View()
	resp := &chimev1.StatusResponse{ShardCount: uint32(c.Shards()), Replication: uint32(c.Replication())}
	ids := make([]string, 0, len(view.Members))
	for id := range view.Members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	replicas := c.AllReplicas(ctx)
	for _, id := range ids {
		m := memberProto(view.Members[id], c.Removed(id))
		m.Ingest = replicas[id].GetIngest()
		resp.Members = append(resp.Members, m)
	}
	for s := range c.Shards() {
		sh := &chimev1.Shard{Id: uint32(s), Desired: c.Desired(uint32(s))}
		var best *chimev1.ReplicaStatus // the leader's replica, else the most advanced one
		for _, st := range replicas {
			for _, r := range st.Replicas {
				if r.Shard != uint32(s) {
					continue
				}
				leads := r.State == chimev1.RaftState_RAFT_STATE_LEADER
				if leads {
					sh.Leader = st.NodeId
					best = r
				} else if best == nil || (best.State != chimev1.RaftState_RAFT_STATE_LEADER && r.AppliedIndex > best.AppliedIndex) {
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
	cc, err := a.c.Conn(node)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "node: %q is not a known member", node)
	}
	return chimev1.NewAdminClient(cc), nil
}

// leaderClient is adminClient for the node a replica names as shard s's
// leader. A replica goes on naming a leader that was just removed until it
// hears of the next election, so a leader gossip does not know is
// leadership on the move, which the caller retries: UNAVAILABLE, where a
// node the user named is NOT_FOUND.
func (a *Admin) leaderClient(s uint32, leader string) (chimev1.AdminClient, error) {
	cc, err := a.c.Conn(leader)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "shard %d: its leader %s is not a known member (leadership is moving); retry in a moment", s, leader)
	}
	return chimev1.NewAdminClient(cc), nil
}

// alone is the FAILED_PRECONDITION of a call that needs other nodes on a
// node that runs without gossip.
func alone(err error) error {
	return status.Errorf(codes.FailedPrecondition, "%v; it needs a cluster (chimed serve, or chimed dev --nodes 3)", err)
}

func (a *Admin) Drain(ctx context.Context, req *chimev1.DrainRequest) (*chimev1.DrainResponse, error) {
	if req.Node == "" {
		return nil, status.Error(codes.InvalidArgument, "node: required")
	}
	if a.c.Alone() {
		return nil, alone(fmt.Errorf("drain: %w: there is no other node to move its replicas to", cluster.ErrAlone))
	}
	if req.Node != a.c.Self() {
		if cluster.Forwarded(ctx) {
			return nil, status.Errorf(codes.Unavailable, "node: %q is not this node", req.Node)
		}
		cl, err := a.adminClient(req.Node)
		if err != nil {
			return nil, err
		}
		return cl.Drain(cluster.ForwardContext(ctx, nil), req)
	}
	// The node that drains checks, with its own view, that the others can
	// take its replicas; a forwarded request carries Force along.
	if err := a.c.Drain(req.Force); err != nil {
		if tooFew := (*cluster.TooFewNodesError)(nil); errors.As(err, &tooFew) {
			return nil, status.Error(codes.FailedPrecondition, tooFew.Error())
		}
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
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
	local := a.c.LocalReplicas()
	resp.SafeToStop = resp.ReplicasRemaining == 0 && resp.LeadersRemaining == 0 && len(local.Replicas) == 0
	return resp, nil
}

func (a *Admin) TransferLeader(ctx context.Context, req *chimev1.TransferLeaderRequest) (*chimev1.TransferLeaderResponse, error) {
	c := a.c
	if int(req.Shard) >= c.Shards() {
		return nil, status.Errorf(codes.InvalidArgument, "shard: %d is out of range (the cluster has %d shards)", req.Shard, c.Shards())
	}
	if req.Node == "" {
		return nil, status.Error(codes.InvalidArgument, "node: required")
	}
	addr, ok := c.RaftAddr(req.Node)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "node: %q is not a known member", req.Node)
	}
	if r := c.LocalLeader(req.Shard); r != nil {
		voters, _, err := r.Configuration()
		if err != nil {
			return nil, cluster.StatusOf(a.logger, "admin", err)
		}
		if !slices.Contains(voters, req.Node) {
			return nil, status.Errorf(codes.FailedPrecondition, "node: %q is not a voter of shard %d (voters: %v)", req.Node, req.Shard, voters)
		}
		if req.Node != c.Self() {
			if err := r.TransferLeadership(req.Node, addr); err != nil {
				return nil, status.Errorf(codes.Aborted, "transfer of shard %d to %s: %v", req.Shard, req.Node, err)
			}
		}
		// The old leader has stepped down; report the new one once this
		// replica hears from it (or an empty leader after transferWait).
		leader, _ := backoff.Retry(ctx, func() (string, error) {
			if l := r.Leader(); l != "" {
				return l, nil
			}
			return "", errNoLeaderYet
		}, backoff.WithBackOff(backoff.NewConstantBackOff(20*time.Millisecond)), backoff.WithMaxElapsedTime(transferWait))
		return &chimev1.TransferLeaderResponse{Leader: leader}, nil
	}
	if cluster.Forwarded(ctx) {
		return nil, status.Errorf(codes.Unavailable, "shard %d: this node no longer leads it; retry", req.Shard)
	}
	leader, err := c.LeaderNode(ctx, req.Shard)
	if err != nil {
		return nil, cluster.StatusOf(a.logger, "admin", err)
	}
	cl, err := a.leaderClient(req.Shard, leader)
	if err != nil {
		return nil, err
	}
	return cl.TransferLeader(cluster.ForwardContext(ctx, nil), req)
}

var errNoLeaderYet = errors.New("no leader known yet")

func (a *Admin) RemoveNode(ctx context.Context, req *chimev1.RemoveNodeRequest) (*chimev1.RemoveNodeResponse, error) {
	c := a.c
	if req.Node == "" {
		return nil, status.Error(codes.InvalidArgument, "node: required")
	}
	if c.Alone() {
		return nil, alone(fmt.Errorf("remove: %w: there is no other node to remove", cluster.ErrAlone))
	}
	if req.Node == c.Self() {
		return nil, status.Error(codes.FailedPrecondition, "node: cannot remove the node that answers; ask another node")
	}
	m, ok := c.Member(req.Node)
	if !ok && !c.Removed(req.Node) {
		return nil, status.Errorf(codes.NotFound, "node: %q is not a known member", req.Node)
	}
	// Force never removes a live node: the other members would refuse to
	// forget it, and its replicas would be dropped while it still serves.
	if ok && m.State.Live() {
		return nil, status.Errorf(codes.FailedPrecondition, "node: %q is %s; drain it instead (chimectl drain %s), or stop it first", req.Node, m.State, req.Node)
	}
	// Within the dead timeout the placement keeps a dead node's replicas in
	// case it comes back (a restart, a network partition); removing it then
	// drops them for good.
	if ago, ok := c.SinceAlive(req.Node); ok && ago < c.DeadTimeout() && !req.Force {
		return nil, status.Errorf(codes.FailedPrecondition,
			"node: %q was seen alive %s ago, within the dead timeout (chimed --dead-timeout %s): it may still come back with its data, "+
				"and the placement keeps its replicas until then; remove it in %s, or now with force (chimectl remove --force) if it will not come back",
			req.Node, ago.Round(time.Second), c.DeadTimeout(), (c.DeadTimeout() - ago).Round(time.Second))
	}
	resp := &chimev1.RemoveNodeResponse{}
	if st, err := a.Status(ctx, &chimev1.StatusRequest{}); err == nil {
		for _, s := range st.Shards {
			if slices.Contains(s.Voters, req.Node) {
				resp.ShardsChanged++
			}
		}
	}
	// On disk here first: whatever the other members answer, this node
	// keeps telling them until each has recorded it.
	if err := c.Remove(req.Node); err != nil {
		return nil, status.Errorf(codes.Internal, "recording the removal: %v", err)
	}
	c.ForgetEverywhere(ctx, req.Node)
	return resp, nil
}

// backupChunkBytes is the most data one Backup message carries: large enough
// that a message's overhead does not count, small enough to stay far below
// gRPC's default 4 MiB receive limit.
const backupChunkBytes = 1 << 20

// Backup streams a copy of one shard from its leader: this node's replica
// when it leads, otherwise the leader's stream relayed message by message
// (so memory stays one chunk whichever way). A relayed call that does not
// reach the leader is not forwarded again: UNAVAILABLE, and the client
// retries.
func (a *Admin) Backup(req *chimev1.BackupRequest, stream chimev1.Admin_BackupServer) error {
	c := a.c
	ctx := stream.Context()
	if int(req.Shard) >= c.Shards() {
		return status.Errorf(codes.InvalidArgument, "shard: %d is out of range (the cluster has %d shards)", req.Shard, c.Shards())
	}
	if r := c.LocalLeader(req.Shard); r != nil {
		// Backup refuses before it sends anything when the replica is no
		// longer the leader; then the leader elsewhere answers.
		if err := a.backupLocal(ctx, r, stream); !errors.Is(err, shard.ErrNotLeader) {
			return err
		}
	}
	if cluster.Forwarded(ctx) {
		return status.Errorf(codes.Unavailable, "shard %d: this node no longer leads it; retry", req.Shard)
	}
	leader, err := c.LeaderNode(ctx, req.Shard)
	if err != nil {
		return cluster.StatusOf(a.logger, "backup", err)
	}
	if leader == c.Self() {
		return status.Errorf(codes.Unavailable, "shard %d is changing leader; retry", req.Shard)
	}
	cl, err := a.leaderClient(req.Shard, leader)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, err := cl.Backup(cluster.ForwardContext(ctx, nil), req)
	if err != nil {
		return err
	}
	for {
		msg, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
}

// backupLocal streams this node's replica r, which leads its shard, and ends
// with the summary. It returns shard.ErrNotLeader, unwrapped for the caller,
// only when it sent nothing.
func (a *Admin) backupLocal(ctx context.Context, r *shard.Shard, stream chimev1.Admin_BackupServer) error {
	w := &backupSender{stream: stream, sum: sha256.New()}
	h, err := r.Backup(ctx, w)
	switch {
	case errors.Is(err, shard.ErrNotLeader) && w.size == 0 && len(w.buf) == 0:
		return err
	case err != nil && w.sendErr != nil:
		return w.sendErr // the client went away, or its deadline passed
	case err != nil:
		return cluster.StatusOf(a.logger, "backup", err)
	}
	return w.finish(&chimev1.BackupSummary{Shard: h.Shard, AppliedIndex: h.AppliedIndex, AppliedTerm: h.AppliedTerm, Node: a.c.Self()})
}

// backupSender cuts what it is written into Backup messages of
// backupChunkBytes and sends each as it fills, counting and hashing the
// stream as it goes.
type backupSender struct {
	stream  chimev1.Admin_BackupServer
	buf     []byte
	sum     hash.Hash
	size    uint64
	sendErr error
}

func (w *backupSender) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.buf == nil {
			// A message must not change once sent (gRPC may read it
			// later): each gets its own buffer.
			w.buf = make([]byte, 0, backupChunkBytes)
		}
		c := min(len(p), backupChunkBytes-len(w.buf))
		w.buf = append(w.buf, p[:c]...)
		p = p[c:]
		if len(w.buf) == backupChunkBytes {
			if err := w.send(nil); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

func (w *backupSender) send(summary *chimev1.BackupSummary) error {
	w.sum.Write(w.buf)
	w.size += uint64(len(w.buf))
	if summary != nil {
		summary.Size, summary.Sha256 = w.size, w.sum.Sum(nil)
	}
	if err := w.stream.Send(&chimev1.BackupChunk{Data: w.buf, Summary: summary}); err != nil {
		w.sendErr = err
		return err
	}
	w.buf = nil
	return nil
}

// finish sends what is left of the stream with the summary.
func (w *backupSender) finish(summary *chimev1.BackupSummary) error {
	return w.send(summary)
}
