package main

// The operator commands: status, drain, transfer-leader, remove and
// cluster-map, over chime.v1.Admin. Any node answers any of them; the node
// at --addr forwards what concerns another node or shard.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// requestCtx bounds one request by --timeout (no bound when it is 0).
func (c *cli) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout > 0 {
		return context.WithTimeout(ctx, c.timeout)
	}
	return context.WithCancel(ctx)
}

// callAdmin dials --addr and runs fn with a context bounded by --timeout,
// sending its call once: TransferLeader, RemoveNode and SetTopicRateLimits
// are not repeated behind the operator's back.
func (c *cli) callAdmin(ctx context.Context, fn func(ctx context.Context, ac chimev1.AdminClient) error) error {
	return c.call(ctx, func(ctx context.Context, cl *client.Client) error {
		return fn(ctx, chimev1.NewAdminClient(cl.Conn()))
	})
}

// readAdmin is callAdmin for a read (Status, GetClusterMap, ...), which the
// client repeats while it may (client.Client.Do): a node restarting or a
// shard between leaders costs a few tries, not the answer.
func (c *cli) readAdmin(ctx context.Context, fn func(ctx context.Context, ac chimev1.AdminClient) error) error {
	return c.call(ctx, func(ctx context.Context, cl *client.Client) error {
		return cl.Do(ctx, func(ctx context.Context, cc grpc.ClientConnInterface) error {
			return fn(ctx, chimev1.NewAdminClient(cc))
		})
	})
}

// pause waits d, on c.sleep when a test set one.
func (c *cli) pause(ctx context.Context, d time.Duration) error {
	if c.sleep != nil {
		return c.sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// oneNode returns the single NODE argument of drain and remove.
func oneNode(args []string) (string, error) {
	if len(args) != 1 {
		return "", usagef("want exactly one node id, got %d arguments", len(args))
	}
	if args[0] == "" {
		return "", usagef("the node id must not be empty")
	}
	return args[0], nil
}

// plural is "1 replica", "3 replicas".
func plural(n uint32, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// table prints rows under a header with the columns aligned and no
// trailing spaces (an empty last cell would leave some).
func table(w io.Writer, header []string, rows [][]string) error {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var out strings.Builder
	for line := range strings.Lines(b.String()) {
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// orDash is "-" for an empty cell.
func orDash(s string) string { return orNone(s, "-") }

// memberJSON is a member in status and cluster-map --json.
type memberJSON struct {
	ID         string  `json:"id"`
	State      string  `json:"state"`
	GRPCAddr   string  `json:"grpc_addr"`
	RaftAddr   string  `json:"raft_addr"`
	GossipAddr string  `json:"gossip_addr"`
	HTTPAddr   string  `json:"http_addr"`
	Since      *string `json:"since"` // RFC 3339 UTC; null when unknown
	// Ingest lists the ingest partitions the member consumes ([] when none).
	Ingest []ingestJSON `json:"ingest"`
}

type ingestJSON struct {
	Topic      string `json:"topic"`
	Partition  int32  `json:"partition"`
	NextOffset int64  `json:"next_offset"` // -1 before the member committed any
	Lag        int64  `json:"lag"`         // -1 before the member committed any
}

func membersJSON(ms []*chimev1.Member) []memberJSON {
	out := []memberJSON{}
	for _, m := range sortedMembers(ms) {
		ingest := []ingestJSON{}
		for _, p := range m.GetIngest() {
			ingest = append(ingest, ingestJSON{Topic: p.GetTopic(), Partition: p.GetPartition(), NextOffset: p.GetNextOffset(), Lag: p.GetLag()})
		}
		out = append(out, memberJSON{
			ID: m.GetId(), State: m.GetState(), GRPCAddr: m.GetGrpcAddr(), RaftAddr: m.GetRaftAddr(),
			GossipAddr: m.GetGossipAddr(), HTTPAddr: m.GetHttpAddr(), Since: jsonTime(m.GetSince()), Ingest: ingest,
		})
	}
	return out
}

func sortedMembers(ms []*chimev1.Member) []*chimev1.Member {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, func(a, b *chimev1.Member) int { return strings.Compare(a.GetId(), b.GetId()) })
	return ms
}

func sortedShards(ss []*chimev1.Shard) []*chimev1.Shard {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b *chimev1.Shard) int { return int(a.GetId()) - int(b.GetId()) })
	return ss
}

// nonNil keeps JSON lists as [] rather than null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func statusCommand() *command {
	return &command{
		name:    "status",
		summary: "show the cluster's members and every shard's leader, replicas and event counts",
		about: `Status asks the node at --addr for the whole cluster as it sees it: one row
per member (its gossip state - alive, suspect, dead, left, draining or
removed - its addresses, and how long it has been in that state), the
partitions of the ingest topics each member consumes (--ingest-topics: the
offset of its next record and the records not yet applied), then one
row per shard: its leader, its voters (the leader marked with *), non-voters
still catching up, the leader's applied Raft index, and its pending, fired
and refired event counts (refired: produced again after a leader change, so
duplicates). A shard is flagged with ! when it has no leader or when its
voters are not yet the ones the placement wants; the lines under the summary
say which. Run it before and after a drain, a restart or a removal to check
that every shard has a leader and its full set of voters again. --json adds
each shard's desired voters and its cancelled and dead-lettered counts.`,
		example: `  chimectl status
  chimectl --addr chime-2:7070 status --json | jq '.shards[] | select(.leader == "")'
  watch -n 2 chimectl status`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				var resp *chimev1.StatusResponse
				err := c.readAdmin(ctx, func(ctx context.Context, ac chimev1.AdminClient) error {
					var err error
					resp, err = ac.Status(ctx, &chimev1.StatusRequest{})
					return err
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(statusToJSON(resp))
				}
				return c.printStatus(resp)
			}
		},
	}
}

// statusJSON is status --json. Every field is always present; lists are
// [] when empty.
type statusJSON struct {
	ShardCount  uint32       `json:"shard_count"`
	Replication uint32       `json:"replication"`
	Members     []memberJSON `json:"members"`
	Shards      []shardJSON  `json:"shards"`
}

type shardJSON struct {
	ID           uint32   `json:"id"`
	Leader       string   `json:"leader"` // "" while there is none
	Voters       []string `json:"voters"`
	Nonvoters    []string `json:"nonvoters"`
	Desired      []string `json:"desired"`
	AppliedIndex uint64   `json:"applied_index"`
	Pending      uint64   `json:"pending"`
	Fired        uint64   `json:"fired"`
	Cancelled    uint64   `json:"cancelled"`
	DeadLettered uint64   `json:"dead_lettered"`
	Refired      uint64   `json:"refired"`
}

func statusToJSON(r *chimev1.StatusResponse) statusJSON {
	out := statusJSON{
		ShardCount:  r.GetShardCount(),
		Replication: r.GetReplication(),
		Members:     membersJSON(r.GetMembers()),
		Shards:      []shardJSON{},
	}
	for _, s := range sortedShards(r.GetShards()) {
		out.Shards = append(out.Shards, shardJSON{
			ID: s.GetId(), Leader: s.GetLeader(),
			Voters: nonNil(s.GetVoters()), Nonvoters: nonNil(s.GetNonvoters()), Desired: nonNil(s.GetDesired()),
			AppliedIndex: s.GetAppliedIndex(), Pending: s.GetPending(), Fired: s.GetFired(),
			Cancelled: s.GetCancelled(), DeadLettered: s.GetDeadLettered(), Refired: s.GetRefired(),
		})
	}
	return out
}

// sameSet reports whether a and b hold the same node ids, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// votersText is the voters, comma-separated, the leader marked with *.
func votersText(s *chimev1.Shard) string {
	vs := make([]string, 0, len(s.GetVoters()))
	for _, v := range s.GetVoters() {
		if v == s.GetLeader() {
			v += "*"
		}
		vs = append(vs, v)
	}
	return orDash(strings.Join(vs, ","))
}

func (c *cli) printStatus(r *chimev1.StatusResponse) error {
	now := c.now()
	var members [][]string
	for _, m := range sortedMembers(r.GetMembers()) {
		since := "-"
		if m.GetSince() != nil {
			since = relative(m.GetSince().AsTime().Sub(now))
		}
		members = append(members, []string{m.GetId(), m.GetState(), orDash(m.GetGrpcAddr()),
			orDash(m.GetRaftAddr()), orDash(m.GetGossipAddr()), since})
	}
	if err := table(c.stdout, []string{"ID", "STATE", "GRPC", "RAFT", "GOSSIP", "SINCE"}, members); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout)
	var ingest [][]string
	for _, m := range sortedMembers(r.GetMembers()) {
		for _, p := range m.GetIngest() {
			next, lag := "-", "-"
			if p.GetNextOffset() >= 0 {
				next, lag = strconv.FormatInt(p.GetNextOffset(), 10), strconv.FormatInt(p.GetLag(), 10)
			}
			ingest = append(ingest, []string{m.GetId(), p.GetTopic(), strconv.Itoa(int(p.GetPartition())), next, lag})
		}
	}
	if len(ingest) > 0 {
		if err := table(c.stdout, []string{"INGEST", "TOPIC", "PARTITION", "NEXT OFFSET", "LAG"}, ingest); err != nil {
			return err
		}
		fmt.Fprintln(c.stdout)
	}

	shards := sortedShards(r.GetShards())
	var (
		cells               [][]string
		withLeader, fullSet int
		leaders             = map[string]int{}
		notes               []string
	)
	for _, s := range shards {
		flagged := ""
		if s.GetLeader() == "" {
			flagged = "!"
			notes = append(notes, fmt.Sprintf("shard %d: no leader", s.GetId()))
		} else {
			withLeader++
			leaders[s.GetLeader()]++
		}
		if !sameSet(s.GetVoters(), s.GetDesired()) {
			flagged = "!"
			notes = append(notes, fmt.Sprintf("shard %d: voters %s, desired %s", s.GetId(),
				orDash(strings.Join(s.GetVoters(), ",")), orDash(strings.Join(s.GetDesired(), ","))))
		}
		if uint32(len(s.GetVoters())) == r.GetReplication() {
			fullSet++
		}
		cells = append(cells, []string{
			strconv.FormatUint(uint64(s.GetId()), 10), orDash(s.GetLeader()), votersText(s),
			orDash(strings.Join(s.GetNonvoters(), ",")),
			strconv.FormatUint(s.GetAppliedIndex(), 10), strconv.FormatUint(s.GetPending(), 10),
			strconv.FormatUint(s.GetFired(), 10), strconv.FormatUint(s.GetRefired(), 10), flagged,
		})
	}
	if err := table(c.stdout, []string{"SHARD", "LEADER", "VOTERS", "NONVOTERS", "APPLIED", "PENDING", "FIRED", "REFIRED", "!"}, cells); err != nil {
		return err
	}

	// Leaders per node: every member that is not removed, even when it leads
	// nothing (a drained or new node shows =0), and any other leader.
	for _, m := range r.GetMembers() {
		if _, ok := leaders[m.GetId()]; !ok && m.GetState() != "removed" {
			leaders[m.GetId()] = 0
		}
	}
	nodes := make([]string, 0, len(leaders))
	for n := range leaders {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	per := make([]string, 0, len(nodes))
	for _, n := range nodes {
		per = append(per, fmt.Sprintf("%s=%d", n, leaders[n]))
	}
	voters := "voters"
	if r.GetReplication() == 1 {
		voters = "voter"
	}
	fmt.Fprintf(c.stdout, "\n%d shards, %d with a leader, %d with %d %s; leaders per node: %s\n",
		len(shards), withLeader, fullSet, r.GetReplication(), voters, orNone(strings.Join(per, " "), "none"))
	for _, n := range notes {
		fmt.Fprintf(c.stdout, "! %s\n", n)
	}
	return nil
}

func drainCommand() *command {
	return &command{
		name:    "drain",
		summary: "move every replica and leadership off a node so it can be stopped safely",
		args:    "[NODE]",
		about: `Drain marks node NODE as draining: the placement stops choosing it, every
shard moves its voter on NODE to another node, and NODE hands over the
shards it leads. Use it before stopping a node for maintenance or for good,
so that stopping it causes no election and loses nothing. By default drain
waits: it asks again every --interval and prints a line each time the
progress changes, until NODE holds no replica, then prints "NODE holds no
replica: safe to stop" and exits 0. After --timeout-drain it exits 1 with
what remains; the node stays draining, and running drain again continues to
follow it. With --no-wait it asks once and prints the progress. Draining
lasts until NODE restarts, which makes it a candidate for replicas again.
Drain refuses (FailedPrecondition, changing nothing) when fewer other nodes
than the replication factor can take NODE's replicas (live, not draining,
not removed), 3 nodes at replication 3 for example: draining would leave
every shard on NODE with fewer voters, so one more failure could cost a
shard its quorum, and every replica is copied back whole when NODE
returns. Add a node first; to restart NODE briefly, move its leaderships
with transfer-leader instead and let it keep its replicas. --force drains
anyway: right when NODE must go for good and no node can replace it, or
when you accept shards short of voters until it returns (status flags
them). A stop hook that drains without --force on such a cluster fails at
once and the node stops undrained: its shards elect new leaders, and it
keeps its replicas through the restart. --json prints only the last
progress, {"node", "replicas_remaining", "leaders_remaining",
"safe_to_stop"}; progress lines then go to standard error. Without NODE,
drain drains the node --addr reaches (asking it its id): what a node's own
stop hook runs, with --addr on loopback.`,
		example: `  chimectl drain node-2 && ssh node-2 systemctl stop chimed
  chimectl --addr 127.0.0.1:7070 drain --timeout-drain 90s   # a preStop or ExecStop hook
  chimectl drain node-2 --timeout-drain 15m --interval 5s --json
  chimectl drain node-2 --force --no-wait   # 3 nodes at replication 3: shards go on with 2 voters`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			wait := fs.Bool("wait", true, "wait until the node is safe to stop, printing progress")
			noWait := fs.Bool("no-wait", false, "ask once, print the progress and return without waiting")
			timeout := fs.Duration("timeout-drain", 5*time.Minute, "with --wait, give up and exit 1 after this `duration`; 0 waits without limit")
			interval := fs.Duration("interval", time.Second, "with --wait, ask for progress this often (a `duration`)")
			force := fs.Bool("force", false, "drain even when its shards would be left with fewer voters than the replication factor")
			return func(ctx context.Context, args []string) error {
				node := "" // the node --addr reaches
				if len(args) > 0 {
					var err error
					if node, err = oneNode(args); err != nil {
						return err
					}
				}
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
				if set["wait"] && set["no-wait"] && *wait == *noWait {
					return usagef("--wait and --no-wait contradict each other; set one")
				}
				if *noWait {
					*wait = false
				}
				if *interval <= 0 {
					return usagef("--interval must be positive")
				}
				if *timeout < 0 {
					return usagef("--timeout-drain must not be negative")
				}
				return c.drain(ctx, node, *wait, *force, *timeout, *interval)
			}
		},
	}
}

type drainJSON struct {
	Node              string `json:"node"`
	ReplicasRemaining uint32 `json:"replicas_remaining"`
	LeadersRemaining  uint32 `json:"leaders_remaining"`
	SafeToStop        bool   `json:"safe_to_stop"`
}

func (c *cli) drain(ctx context.Context, node string, wait, force bool, limit, interval time.Duration) error {
	cl, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cl.Close() }() // fails only for a client already closed
	// Drain is sent once per poll: with --wait the loop below is its retry,
	// and reports each failed poll.
	ac := chimev1.NewAdminClient(cl.Conn())
	if node == "" {
		rctx, cancel := c.requestCtx(ctx)
		var st *chimev1.NodeStatusResponse
		err := cl.Do(rctx, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
			st, err = chimev1.NewAdminClient(cc).NodeStatus(ctx, &chimev1.NodeStatusRequest{})
			return err
		})
		cancel()
		if err != nil {
			return fmt.Errorf("asking %s which node it is: %w", c.addr, err)
		}
		node = st.GetNodeId()
	}
	ask := func() (*chimev1.DrainResponse, error) {
		ctx, cancel := c.requestCtx(ctx)
		defer cancel()
		return ac.Drain(ctx, &chimev1.DrainRequest{Node: node, Force: force})
	}
	// Progress lines are the output in text mode; with --json they are
	// commentary, so they go to standard error and stdout stays one object.
	progress := c.stdout
	if c.json {
		progress = c.stderr
	}
	final := func(r *chimev1.DrainResponse) error {
		if c.json {
			return c.printJSON(drainJSON{node, r.GetReplicasRemaining(), r.GetLeadersRemaining(), r.GetSafeToStop()})
		}
		if r.GetSafeToStop() {
			_, err := fmt.Fprintf(c.stdout, "%s holds no replica: safe to stop\n", node)
			return err
		}
		return nil
	}
	remaining := func(r *chimev1.DrainResponse) string {
		return fmt.Sprintf("%s and %s remaining", plural(r.GetReplicasRemaining(), "replica", "replicas"),
			plural(r.GetLeadersRemaining(), "leadership", "leaderships"))
	}

	if !wait {
		r, err := ask()
		if err != nil {
			return err
		}
		if !r.GetSafeToStop() && !c.json {
			fmt.Fprintf(c.stdout, "%s: %s; not yet safe to stop\n", node, remaining(r))
		}
		return final(r)
	}

	start := c.now()
	var last *chimev1.DrainResponse
	for {
		r, err := ask()
		switch {
		case err == nil:
			if last == nil || r.GetReplicasRemaining() != last.GetReplicasRemaining() ||
				r.GetLeadersRemaining() != last.GetLeadersRemaining() || r.GetSafeToStop() != last.GetSafeToStop() {
				if !r.GetSafeToStop() {
					fmt.Fprintf(progress, "%s: %s remaining, %s (%s)\n", node,
						plural(r.GetReplicasRemaining(), "replica", "replicas"),
						plural(r.GetLeadersRemaining(), "leadership", "leaderships"),
						humanDuration(c.now().Sub(start).Round(time.Second)))
				}
			}
			last = r
			if r.GetSafeToStop() {
				return final(r)
			}
		case last != nil && status.Code(err) == codes.Unavailable:
			// A node restarting or a leadership moving mid-drain: the next
			// call usually gets through. The first call failing is not
			// this, so it fails at once (wrong --addr, unknown node).
			fmt.Fprintf(c.stderr, "chimectl drain: %s: %s; retrying\n", status.Code(err), status.Convert(err).Message())
		default:
			return err
		}

		elapsed := c.now().Sub(start)
		if limit > 0 && elapsed >= limit {
			if c.json {
				if err := final(last); err != nil {
					return err
				}
			}
			return status.Errorf(codes.DeadlineExceeded, "%s is not safe to stop after %s: %s; it stays draining (run drain again to keep following it)",
				node, humanDuration(limit), remaining(last))
		}
		wait := interval
		if limit > 0 {
			wait = min(wait, limit-elapsed)
		}
		if err := c.pause(ctx, wait); err != nil {
			return fmt.Errorf("interrupted: %s is not safe to stop yet (%s); it stays draining", node, remaining(last))
		}
	}
}

func transferLeaderCommand() *command {
	return &command{
		name:    "transfer-leader",
		summary: "move a shard's leadership to another of its voters",
		args:    "SHARD NODE",
		about: `Transfer-leader asks shard SHARD (a number from 0 to the shard count minus
one) to hand its Raft leadership to node NODE, which must be one of its
voters (see chimectl status). Use it to even out leaders across nodes, or to
move leadership off a node before restarting it when a full drain is more
than you need; writes to the shard wait while leadership moves. For a
minute after a membership change, shards move leadership to their preferred
node by themselves, which can undo a transfer made then. It prints the
leader after the transfer; it fails with FailedPrecondition when NODE is
not a voter of the shard and InvalidArgument when SHARD is out of range.`,
		example: `  chimectl transfer-leader 3 node-1
  chimectl transfer-leader 0 node-2 --addr chime-0:7070 --json`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error {
				if len(args) != 2 {
					return usagef("want SHARD and NODE, got %d arguments", len(args))
				}
				shard, err := strconv.ParseUint(args[0], 10, 32)
				if err != nil {
					return usagef("SHARD %q is not a shard number (a non-negative integer)", args[0])
				}
				node := args[1]
				if node == "" {
					return usagef("the node id must not be empty")
				}
				var resp *chimev1.TransferLeaderResponse
				err = c.callAdmin(ctx, func(ctx context.Context, ac chimev1.AdminClient) error {
					resp, err = ac.TransferLeader(ctx, &chimev1.TransferLeaderRequest{Shard: uint32(shard), Node: node})
					return err
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(struct {
						Shard  uint32 `json:"shard"`
						Leader string `json:"leader"`
					}{uint32(shard), resp.GetLeader()})
				}
				switch resp.GetLeader() {
				case node:
					_, err = fmt.Fprintf(c.stdout, "shard %d: leader is now %s\n", shard, node)
				case "":
					_, err = fmt.Fprintf(c.stdout, "shard %d: leadership is moving to %s; no leader yet (check with chimectl status)\n", shard, node)
				default:
					_, err = fmt.Fprintf(c.stdout, "shard %d: leader is now %s, not %s (another election won)\n", shard, resp.GetLeader(), node)
				}
				return err
			}
		},
	}
}

func removeCommand() *command {
	return &command{
		name:    "remove",
		summary: "forget a dead node for good so its shards place replacements",
		args:    "NODE",
		about: `Remove is for a node that will NOT come back (its machine or disk is lost):
every shard that has NODE as a voter drops it at once and places a
replacement replica on another node, so the shard is back to full
replication. A node that is still alive (alive, suspect or draining) is
refused with FailedPrecondition, --force or not: to take a live node out,
drain it instead (chimectl drain NODE), then stop it. A node seen alive
within the dead timeout (chimed --dead-timeout, 2m by default) is refused
too: it may be restarting or cut off for a moment, and it would come back
with its data and keep its replicas, while removing it drops them for good.
Wait until the timeout has passed (the message says how long), or pass
--force when you know the node will not come back (its machine or disk is
gone), to place the replacements now. Removal cannot be undone: every node
records NODE as removed on its disk, a node that was down at the time
learns it from the others when it returns, and none places a replica on
NODE again. To bring that machine back, wipe its data dir (chimed
--data-dir) and start it with a new --node-id, so it joins as a new, empty
node. It prints how many shards dropped the node.`,
		example: `  chimectl status    # node-3 is dead and its machine is gone
  chimectl remove node-3
  chimectl remove node-3 --force   # dead for less than --dead-timeout, its disk is lost
  chimectl remove node-3 --addr chime-0:7070 --json`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			force := fs.Bool("force", false, "remove NODE even though it was seen alive within the dead timeout (never a live node)")
			return func(ctx context.Context, args []string) error {
				node, err := oneNode(args)
				if err != nil {
					return err
				}
				var resp *chimev1.RemoveNodeResponse
				err = c.callAdmin(ctx, func(ctx context.Context, ac chimev1.AdminClient) error {
					resp, err = ac.RemoveNode(ctx, &chimev1.RemoveNodeRequest{Node: node, Force: *force})
					return err
				})
				if err != nil {
					return err
				}
				n := resp.GetShardsChanged()
				if c.json {
					return c.printJSON(struct {
						Node          string `json:"node"`
						ShardsChanged uint32 `json:"shards_changed"`
					}{node, n})
				}
				if n == 0 {
					_, err = fmt.Fprintf(c.stdout, "%s removed; no shard had it as a voter\n", node)
					return err
				}
				verb := "shards dropped"
				if n == 1 {
					verb = "shard dropped"
				}
				_, err = fmt.Fprintf(c.stdout, "%s removed; %d %s it and will place a replacement\n", node, n, verb)
				return err
			}
		},
	}
}

func clusterMapCommand() *command {
	return &command{
		name:    "cluster-map",
		summary: "show each shard's leader and its gRPC address, as clients route to it",
		about: `Cluster-map prints the routing table clients use to send each request
straight to a shard's leader: per shard, the leader's node id, its gRPC
address and the voters. An event id belongs to shard fnv1a64(id) mod the
shard count. It is cheaper than status (no event counts) and is what to
compare when a client seems to send requests to the wrong node. --json adds
the members, the shard count and the replication.`,
		example: `  chimectl cluster-map
  chimectl cluster-map --json | jq -r '.shards[] | "\(.id) \(.leader_grpc_addr)"'`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				var m *chimev1.ClusterMap
				err := c.readAdmin(ctx, func(ctx context.Context, ac chimev1.AdminClient) error {
					var err error
					m, err = ac.GetClusterMap(ctx, &chimev1.GetClusterMapRequest{})
					return err
				})
				if err != nil {
					return err
				}
				grpcAddr := map[string]string{}
				for _, mem := range m.GetMembers() {
					grpcAddr[mem.GetId()] = mem.GetGrpcAddr()
				}
				if c.json {
					out := clusterMapJSON{
						ShardCount: m.GetShardCount(), Replication: m.GetReplication(),
						Members: membersJSON(m.GetMembers()), Shards: []routeJSON{},
					}
					for _, s := range sortedShards(m.GetShards()) {
						out.Shards = append(out.Shards, routeJSON{
							ID: s.GetId(), Leader: s.GetLeader(), LeaderGRPCAddr: grpcAddr[s.GetLeader()],
							Voters: nonNil(s.GetVoters()), Nonvoters: nonNil(s.GetNonvoters()), Desired: nonNil(s.GetDesired()),
						})
					}
					return c.printJSON(out)
				}
				var rows [][]string
				for _, s := range sortedShards(m.GetShards()) {
					rows = append(rows, []string{strconv.FormatUint(uint64(s.GetId()), 10), orDash(s.GetLeader()),
						orDash(grpcAddr[s.GetLeader()]), votersText(s)})
				}
				return table(c.stdout, []string{"SHARD", "LEADER", "GRPC", "VOTERS"}, rows)
			}
		},
	}
}

// clusterMapJSON is cluster-map --json.
type clusterMapJSON struct {
	ShardCount  uint32       `json:"shard_count"`
	Replication uint32       `json:"replication"`
	Members     []memberJSON `json:"members"`
	Shards      []routeJSON  `json:"shards"`
}

type routeJSON struct {
	ID             uint32   `json:"id"`
	Leader         string   `json:"leader"`
	LeaderGRPCAddr string   `json:"leader_grpc_addr"` // "" without a leader
	Voters         []string `json:"voters"`
	Nonvoters      []string `json:"nonvoters"`
	Desired        []string `json:"desired"`
}
