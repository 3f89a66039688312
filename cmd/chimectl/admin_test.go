package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// fakeAdmin answers chime.v1.Admin with canned responses and records what
// it was asked. The real Admin server is exercised by the cluster tests.
type fakeAdmin struct {
	chimev1.UnimplementedAdminServer

	status     *chimev1.StatusResponse
	clusterMap *chimev1.ClusterMap
	// drain is the script of Drain answers, one per call; the last one
	// repeats.
	drain []drainStep
	// transferLeader is the leader TransferLeader reports; "" reports the
	// requested node.
	transferLeader string
	transferErr    error
	removeChanged  uint32
	removeErr      error

	mu    sync.Mutex
	calls []string // "Drain node-2", "TransferLeader 3 node-1", ...
}

type drainStep struct {
	replicas, leaders uint32
	safe              bool
	err               error
}

func (f *fakeAdmin) record(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	return len(f.calls)
}

func (f *fakeAdmin) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeAdmin) Status(context.Context, *chimev1.StatusRequest) (*chimev1.StatusResponse, error) {
	f.record("Status")
	return f.status, nil
}

func (f *fakeAdmin) GetClusterMap(context.Context, *chimev1.GetClusterMapRequest) (*chimev1.ClusterMap, error) {
	f.record("GetClusterMap")
	return f.clusterMap, nil
}

func (f *fakeAdmin) Drain(_ context.Context, req *chimev1.DrainRequest) (*chimev1.DrainResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	call := "Drain " + req.GetNode()
	if req.GetForce() {
		call += " --force"
	}
	f.calls = append(f.calls, call)
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, "Drain ") {
			n++
		}
	}
	s := f.drain[min(n, len(f.drain))-1]
	if s.err != nil {
		return nil, s.err
	}
	return &chimev1.DrainResponse{Node: req.GetNode(), ReplicasRemaining: s.replicas, LeadersRemaining: s.leaders, SafeToStop: s.safe}, nil
}

// NodeStatus answers as node-2, the node a drain without a node id asks.
func (f *fakeAdmin) NodeStatus(context.Context, *chimev1.NodeStatusRequest) (*chimev1.NodeStatusResponse, error) {
	f.record("NodeStatus")
	return &chimev1.NodeStatusResponse{NodeId: "node-2"}, nil
}

func (f *fakeAdmin) TransferLeader(_ context.Context, req *chimev1.TransferLeaderRequest) (*chimev1.TransferLeaderResponse, error) {
	f.record("TransferLeader " + uitoa(req.GetShard()) + " " + req.GetNode())
	if f.transferErr != nil {
		return nil, f.transferErr
	}
	leader := f.transferLeader
	if leader == "" {
		leader = req.GetNode()
	}
	return &chimev1.TransferLeaderResponse{Leader: leader}, nil
}

func (f *fakeAdmin) RemoveNode(_ context.Context, req *chimev1.RemoveNodeRequest) (*chimev1.RemoveNodeResponse, error) {
	call := "RemoveNode " + req.GetNode()
	if req.GetForce() {
		call += " --force"
	}
	f.record(call)
	if f.removeErr != nil {
		return nil, f.removeErr
	}
	return &chimev1.RemoveNodeResponse{ShardsChanged: f.removeChanged}, nil
}

func uitoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// startAdmin serves f on a loopback port.
func startAdmin(t *testing.T, f chimev1.AdminServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	chimev1.RegisterAdminServer(gs, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the fake: %v", err)
		}
	}()
	t.Cleanup(func() { gs.Stop(); <-done })
	return ln.Addr().String()
}

// fakeClock is chimectl's clock in the drain tests: sleeping advances it at
// once, and it remembers each sleep. Only the chimectl goroutine uses it.
type fakeClock struct {
	t      time.Time
	sleeps []time.Duration
	// interruptAfter > 0 makes that sleep fail as a Ctrl-C would.
	interruptAfter int
}

func (c *fakeClock) now() time.Time { return c.t }

func (c *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	c.sleeps = append(c.sleeps, d)
	if len(c.sleeps) == c.interruptAfter || len(c.sleeps) > 1000 { // or a runaway loop
		return context.Canceled
	}
	c.t = c.t.Add(d)
	return nil
}

// chimectlAt runs chimectl like chimectl(), on clock.
func chimectlAt(t *testing.T, clock *fakeClock, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	c := &cli{
		stdin:  strings.NewReader(""),
		stdout: &out,
		stderr: &errOut,
		getenv: func(string) string { return "" },
		now:    clock.now,
		sleep:  clock.sleep,
		loc:    cet,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := c.run(ctx, args)
	return result{code, out.String(), errOut.String()}
}

func member(id, state string, age time.Duration) *chimev1.Member {
	i := id[len(id)-1:]
	m := &chimev1.Member{Id: id, State: state, GrpcAddr: "10.0.0." + i + ":7070", RaftAddr: "10.0.0." + i + ":7071",
		GossipAddr: "10.0.0." + i + ":7072", HttpAddr: "10.0.0." + i + ":7080"}
	if age >= 0 {
		m.Since = timestamppb.New(t0.Add(-age))
	}
	return m
}

// healthyStatus is 3 nodes, 8 shards of 3 voters, leaders 3/3/2. The
// members and shards come unsorted, as a server may send them.
func healthyStatus() *chimev1.StatusResponse {
	r := &chimev1.StatusResponse{ShardCount: 8, Replication: 3, Members: []*chimev1.Member{
		member("node-1", "alive", 200*time.Second),
		member("node-0", "alive", 90*time.Minute),
		member("node-2", "alive", 4*time.Second),
	}}
	r.Members[0].Ingest = []*chimev1.IngestPartition{
		{Topic: "chime.schedule", Partition: 0, NextOffset: 1200, Lag: 30},
		{Topic: "chime.schedule", Partition: 2, NextOffset: -1, Lag: -1},
	}
	for _, s := range []uint32{7, 0, 1, 2, 3, 4, 5, 6} {
		r.Shards = append(r.Shards, &chimev1.Shard{
			Id: s, Leader: "node-" + uitoa(s%3),
			Voters:       []string{"node-0", "node-1", "node-2"},
			Desired:      []string{"node-2", "node-0", "node-1"}, // same set, another order
			AppliedIndex: 1000 + uint64(s), Pending: 10 * uint64(s), Fired: 100 * uint64(s),
			Cancelled: uint64(s), DeadLettered: uint64(s % 2), Refired: uint64(s / 4),
		})
	}
	return r
}

func TestStatusText(t *testing.T) {
	f := &fakeAdmin{status: healthyStatus()}
	addr := startAdmin(t, f)
	chimectl(t, nil, "", "--addr", addr, "status").want(t, 0, `ID      STATE  GRPC           RAFT           GOSSIP         SINCE
node-0  alive  10.0.0.0:7070  10.0.0.0:7071  10.0.0.0:7072  1h30m ago
node-1  alive  10.0.0.1:7070  10.0.0.1:7071  10.0.0.1:7072  3m20s ago
node-2  alive  10.0.0.2:7070  10.0.0.2:7071  10.0.0.2:7072  4s ago

INGEST  TOPIC           PARTITION  NEXT OFFSET  LAG
node-1  chime.schedule  0          1200         30
node-1  chime.schedule  2          -            -

SHARD  LEADER  VOTERS                 NONVOTERS  APPLIED  PENDING  FIRED  REFIRED  !
0      node-0  node-0*,node-1,node-2  -          1000     0        0      0
1      node-1  node-0,node-1*,node-2  -          1001     10       100    0
2      node-2  node-0,node-1,node-2*  -          1002     20       200    0
3      node-0  node-0*,node-1,node-2  -          1003     30       300    0
4      node-1  node-0,node-1*,node-2  -          1004     40       400    1
5      node-2  node-0,node-1,node-2*  -          1005     50       500    1
6      node-0  node-0*,node-1,node-2  -          1006     60       600    1
7      node-1  node-0,node-1*,node-2  -          1007     70       700    1

8 shards, 8 with a leader, 8 with 3 voters; leaders per node: node-0=3 node-1=3 node-2=2
`, "")
	if got := f.Calls(); !slices.Equal(got, []string{"Status"}) {
		t.Fatalf("calls: %v", got)
	}
}

func TestStatusFlagsShardsWithoutLeaderOrDesiredVoters(t *testing.T) {
	r := &chimev1.StatusResponse{ShardCount: 3, Replication: 3, Members: []*chimev1.Member{
		member("node-0", "alive", time.Minute),
		member("node-1", "draining", 5*time.Second),
		member("node-2", "alive", time.Minute),
		member("node-3", "dead", 2*time.Minute),
		member("node-4", "removed", -1), // no since
	}, Shards: []*chimev1.Shard{
		// A replacement catching up for the dead node-3.
		{Id: 0, Leader: "node-0", Voters: []string{"node-0", "node-1", "node-3"}, Nonvoters: []string{"node-2"},
			Desired: []string{"node-0", "node-1", "node-2"}, AppliedIndex: 50},
		// No leader: two of its voters are gone.
		{Id: 1, Voters: []string{"node-1", "node-3", "node-4"}, Desired: []string{"node-1", "node-3", "node-4"}},
		{Id: 2, Leader: "node-2", Voters: []string{"node-2", "node-0"}, Desired: []string{"node-0", "node-2"}, AppliedIndex: 7},
	}}
	addr := startAdmin(t, &fakeAdmin{status: r})
	out := chimectl(t, nil, "", "--addr", addr, "status")
	if out.code != 0 || out.stderr != "" {
		t.Fatalf("status: %+v", out)
	}
	lines := strings.Split(out.stdout, "\n")
	want := map[string][]string{ // first cells of a row -> all its cells
		"node-1": {"node-1", "draining", "10.0.0.1:7070", "10.0.0.1:7071", "10.0.0.1:7072", "5s", "ago"},
		"node-3": {"node-3", "dead", "10.0.0.3:7070", "10.0.0.3:7071", "10.0.0.3:7072", "2m", "ago"},
		"node-4": {"node-4", "removed", "10.0.0.4:7070", "10.0.0.4:7071", "10.0.0.4:7072", "-"},
		"0":      {"0", "node-0", "node-0*,node-1,node-3", "node-2", "50", "0", "0", "0", "!"},
		"1":      {"1", "-", "node-1,node-3,node-4", "-", "0", "0", "0", "0", "!"},
		"2":      {"2", "node-2", "node-2*,node-0", "-", "7", "0", "0", "0"},
	}
	for _, l := range lines {
		fields := strings.Fields(l)
		if len(fields) == 0 {
			continue
		}
		if w, ok := want[fields[0]]; ok {
			if !slices.Equal(fields, w) {
				t.Errorf("row %q: got %q, want %q", fields[0], fields, w)
			}
			delete(want, fields[0])
		}
	}
	if len(want) != 0 {
		t.Errorf("rows missing: %v\n%s", want, out.stdout)
	}
	tail := "\n3 shards, 2 with a leader, 2 with 3 voters; leaders per node: node-0=1 node-1=0 node-2=1 node-3=0\n" +
		"! shard 0: voters node-0,node-1,node-3, desired node-0,node-1,node-2\n" +
		"! shard 1: no leader\n"
	if !strings.HasSuffix(out.stdout, tail) {
		t.Errorf("status does not end with\n%s\ngot:\n%s", tail, out.stdout)
	}
}

func TestStatusJSON(t *testing.T) {
	st := healthyStatus()
	st.Members = append(st.Members, member("node-9", "removed", -1))
	st.Shards[0].Nonvoters = []string{"node-9"} // shard 7
	addr := startAdmin(t, &fakeAdmin{status: st})
	r := chimectl(t, nil, "", "--addr", addr, "status", "--json")
	if r.code != 0 || r.stderr != "" || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("status --json: %+v", r)
	}

	// The keys, exactly.
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatal(err)
	}
	keys := func(m map[string]any) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	if got := keys(raw); !slices.Equal(got, []string{"members", "replication", "shard_count", "shards"}) {
		t.Errorf("top-level keys %v", got)
	}
	m0 := raw["members"].([]any)[0].(map[string]any)
	if got := keys(m0); !slices.Equal(got, []string{"gossip_addr", "grpc_addr", "http_addr", "id", "ingest", "raft_addr", "since", "state"}) {
		t.Errorf("member keys %v", got)
	}
	s0 := raw["shards"].([]any)[0].(map[string]any)
	if got := keys(s0); !slices.Equal(got, []string{"applied_index", "cancelled", "dead_lettered", "desired", "fired", "id", "leader", "nonvoters", "pending", "refired", "voters"}) {
		t.Errorf("shard keys %v", got)
	}
	if !strings.Contains(r.stdout, `"nonvoters":[]`) || strings.Count(r.stdout, "null") != 1 || !strings.Contains(r.stdout, `"since":null`) {
		t.Errorf("empty lists must be [], and only the unknown since null: %s", r.stdout)
	}

	// The values.
	var got statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	str := func(s string) *string { return &s }
	if got.ShardCount != 8 || got.Replication != 3 || len(got.Members) != 4 || len(got.Shards) != 8 {
		t.Fatalf("status --json: %+v", got)
	}
	wantMembers := []memberJSON{
		{"node-0", "alive", "10.0.0.0:7070", "10.0.0.0:7071", "10.0.0.0:7072", "10.0.0.0:7080", str("2026-03-01T10:30:00Z"), []ingestJSON{}},
		{"node-1", "alive", "10.0.0.1:7070", "10.0.0.1:7071", "10.0.0.1:7072", "10.0.0.1:7080", str("2026-03-01T11:56:40Z"),
			[]ingestJSON{{"chime.schedule", 0, 1200, 30}, {"chime.schedule", 2, -1, -1}}},
		{"node-2", "alive", "10.0.0.2:7070", "10.0.0.2:7071", "10.0.0.2:7072", "10.0.0.2:7080", str("2026-03-01T11:59:56Z"), []ingestJSON{}},
		{"node-9", "removed", "10.0.0.9:7070", "10.0.0.9:7071", "10.0.0.9:7072", "10.0.0.9:7080", nil, []ingestJSON{}},
	}
	if !reflect.DeepEqual(got.Members, wantMembers) {
		t.Errorf("members:\n got %+v\nwant %+v", got.Members, wantMembers)
	}
	want5 := shardJSON{ID: 5, Leader: "node-2", Voters: []string{"node-0", "node-1", "node-2"}, Nonvoters: []string{},
		Desired: []string{"node-2", "node-0", "node-1"}, AppliedIndex: 1005, Pending: 50, Fired: 500, Cancelled: 5, DeadLettered: 1, Refired: 1}
	if !reflect.DeepEqual(got.Shards[5], want5) {
		t.Errorf("shard 5:\n got %+v\nwant %+v", got.Shards[5], want5)
	}
	if s7 := got.Shards[7]; s7.ID != 7 || !slices.Equal(s7.Nonvoters, []string{"node-9"}) || s7.Leader != "node-1" {
		t.Errorf("shard 7: %+v", s7)
	}
}

func TestStatusOfAnEmptyClusterPrintsEmptyLists(t *testing.T) {
	addr := startAdmin(t, &fakeAdmin{status: &chimev1.StatusResponse{ShardCount: 0, Replication: 3}})
	chimectl(t, nil, "", "--addr", addr, "--json", "status").
		want(t, 0, `{"shard_count":0,"replication":3,"members":[],"shards":[]}`+"\n", "")
	r := chimectl(t, nil, "", "--addr", addr, "status")
	if r.code != 0 || !strings.HasSuffix(r.stdout, "\n0 shards, 0 with a leader, 0 with 3 voters; leaders per node: none\n") {
		t.Fatalf("empty status: %+v", r)
	}
	// chimed dev: one node, replication 1.
	addr = startAdmin(t, &fakeAdmin{status: &chimev1.StatusResponse{ShardCount: 0, Replication: 1}})
	if r := chimectl(t, nil, "", "--addr", addr, "status"); r.code != 0 || !strings.HasSuffix(r.stdout, " 0 with 1 voter; leaders per node: none\n") {
		t.Fatalf("status at replication 1: %+v", r)
	}
}

// TestDrainWithoutNodeDrainsTheNodeAsked: with no node id, drain asks the
// node at --addr which node it is and drains that one, as a stop hook on
// the node itself does.
func TestDrainWithoutNodeDrainsTheNodeAsked(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{{replicas: 1}, {safe: true}}}
	addr := startAdmin(t, f)
	chimectlAt(t, &fakeClock{t: t0}, "--addr", addr, "drain", "--interval", "1s").want(t, 0,
		"node-2: 1 replica remaining, 0 leaderships (0s)\nnode-2 holds no replica: safe to stop\n", "")
	if got := f.Calls(); !slices.Equal(got, []string{"NodeStatus", "Drain node-2", "Drain node-2"}) {
		t.Errorf("calls %q", got)
	}
}

func TestDrainWaitsUntilSafeToStop(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{{replicas: 5, leaders: 1}, {replicas: 3}, {safe: true}}}
	addr := startAdmin(t, f)
	clock := &fakeClock{t: t0}
	chimectlAt(t, clock, "--addr", addr, "drain", "node-2", "--interval", "2s").want(t, 0,
		"node-2: 5 replicas remaining, 1 leadership (0s)\n"+
			"node-2: 3 replicas remaining, 0 leaderships (2s)\n"+
			"node-2 holds no replica: safe to stop\n", "")
	if got := f.Calls(); !slices.Equal(got, []string{"Drain node-2", "Drain node-2", "Drain node-2"}) {
		t.Errorf("calls: %v", got)
	}
	if !slices.Equal(clock.sleeps, []time.Duration{2 * time.Second, 2 * time.Second}) {
		t.Errorf("slept %v", clock.sleeps)
	}
}

func TestDrainPrintsOnlyChangesAndRetriesUnavailable(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{
		{replicas: 5, leaders: 2},
		{replicas: 5, leaders: 2},
		{replicas: 4, leaders: 2},
		{err: status.Error(codes.Unavailable, "shard 3: this node no longer leads it; retry")},
		{replicas: 4, leaders: 2},
		{replicas: 1, leaders: 0},
		{replicas: 0, leaders: 0}, // its replicas not shut down yet
		{safe: true},
	}}
	addr := startAdmin(t, f)
	clock := &fakeClock{t: t0}
	chimectlAt(t, clock, "--addr", addr, "drain", "node-2").want(t, 0,
		"node-2: 5 replicas remaining, 2 leaderships (0s)\n"+
			"node-2: 4 replicas remaining, 2 leaderships (2s)\n"+
			"node-2: 1 replica remaining, 0 leaderships (5s)\n"+
			"node-2: 0 replicas remaining, 0 leaderships (6s)\n"+
			"node-2 holds no replica: safe to stop\n",
		"chimectl drain: Unavailable: shard 3: this node no longer leads it; retry; retrying\n")
	if n := len(f.Calls()); n != 8 {
		t.Errorf("%d calls, want 8", n)
	}
}

func TestDrainTimesOutWithWhatRemains(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{{replicas: 2, leaders: 1}}}
	addr := startAdmin(t, f)
	clock := &fakeClock{t: t0}
	chimectlAt(t, clock, "--addr", addr, "drain", "node-2", "--timeout-drain", "5s", "--interval", "2s").want(t, 1,
		"node-2: 2 replicas remaining, 1 leadership (0s)\n",
		"chimectl: DeadlineExceeded: node-2 is not safe to stop after 5s: 2 replicas and 1 leadership remaining; it stays draining (run drain again to keep following it)\n")
	// Asked at 0, 2s, 4s and once more at the deadline.
	if n := len(f.Calls()); n != 4 {
		t.Errorf("%d calls, want 4", n)
	}
	if !slices.Equal(clock.sleeps, []time.Duration{2 * time.Second, 2 * time.Second, time.Second}) {
		t.Errorf("slept %v", clock.sleeps)
	}

	// --json still prints the last progress, for the script to read.
	clock = &fakeClock{t: t0}
	chimectlAt(t, clock, "--addr", addr, "--json", "drain", "node-2", "--timeout-drain", "1s").want(t, 1,
		`{"node":"node-2","replicas_remaining":2,"leaders_remaining":1,"safe_to_stop":false}`+"\n",
		"node-2: 2 replicas remaining, 1 leadership (0s)\n"+
			"chimectl: DeadlineExceeded: node-2 is not safe to stop after 1s: 2 replicas and 1 leadership remaining; it stays draining (run drain again to keep following it)\n")
}

func TestDrainInterrupted(t *testing.T) {
	addr := startAdmin(t, &fakeAdmin{drain: []drainStep{{replicas: 1, leaders: 1}}})
	clock := &fakeClock{t: t0, interruptAfter: 2}
	chimectlAt(t, clock, "--addr", addr, "drain", "node-2").want(t, 1,
		"node-2: 1 replica remaining, 1 leadership (0s)\n",
		"chimectl: interrupted: node-2 is not safe to stop yet (1 replica and 1 leadership remaining); it stays draining\n")
}

func TestDrainJSONPrintsTheFinalResponse(t *testing.T) {
	addr := startAdmin(t, &fakeAdmin{drain: []drainStep{{replicas: 1}, {safe: true}}})
	chimectlAt(t, &fakeClock{t: t0}, "--addr", addr, "drain", "--json", "node-2").want(t, 0,
		`{"node":"node-2","replicas_remaining":0,"leaders_remaining":0,"safe_to_stop":true}`+"\n",
		"node-2: 1 replica remaining, 0 leaderships (0s)\n")
}

func TestDrainNoWaitAsksOnce(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{{replicas: 5, leaders: 1}, {safe: true}}}
	addr := startAdmin(t, f)
	clock := &fakeClock{t: t0}
	chimectlAt(t, clock, "--addr", addr, "drain", "node-2", "--no-wait").
		want(t, 0, "node-2: 5 replicas and 1 leadership remaining; not yet safe to stop\n", "")
	chimectlAt(t, clock, "--addr", addr, "drain", "node-2", "--wait=false", "--json").
		want(t, 0, `{"node":"node-2","replicas_remaining":0,"leaders_remaining":0,"safe_to_stop":true}`+"\n", "")
	chimectlAt(t, clock, "--addr", addr, "drain", "node-2", "--no-wait").
		want(t, 0, "node-2 holds no replica: safe to stop\n", "")
	if n := len(f.Calls()); n != 3 || len(clock.sleeps) != 0 {
		t.Errorf("%d calls and sleeps %v, want 3 calls and no sleep", n, clock.sleeps)
	}
}

// TestDrainOnTheRealClock runs the wait loop with real sleeps, briefly.
func TestDrainOnTheRealClock(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{{replicas: 2}, {replicas: 1}, {safe: true}}}
	addr := startAdmin(t, f)
	start := time.Now()
	r := chimectl(t, nil, "", "--addr", addr, "drain", "node-2", "--interval", "20ms")
	if r.code != 0 || !strings.HasSuffix(r.stdout, "node-2 holds no replica: safe to stop\n") || strings.Count(r.stdout, "\n") != 3 {
		t.Fatalf("drain: %+v", r)
	}
	if took := time.Since(start); took < 40*time.Millisecond {
		t.Errorf("3 calls 20ms apart took %v", took)
	}
}

func TestDrainFailsAtOnceWhenTheFirstCallFails(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{{err: status.Error(codes.NotFound, `node: "node-9" is not a known member`)}, {safe: true}}}
	addr := startAdmin(t, f)
	chimectlAt(t, &fakeClock{t: t0}, "--addr", addr, "drain", "node-9").
		want(t, 1, "", `chimectl: NotFound: node: "node-9" is not a known member`+"\n")
	if n := len(f.Calls()); n != 1 {
		t.Errorf("%d calls, want 1", n)
	}
}

func TestTransferLeader(t *testing.T) {
	f := &fakeAdmin{}
	addr := startAdmin(t, f)
	chimectl(t, nil, "", "--addr", addr, "transfer-leader", "3", "node-1").want(t, 0, "shard 3: leader is now node-1\n", "")
	chimectl(t, nil, "", "--addr", addr, "transfer-leader", "0", "node-2", "--json").want(t, 0, `{"shard":0,"leader":"node-2"}`+"\n", "")
	if got := f.Calls(); !slices.Equal(got, []string{"TransferLeader 3 node-1", "TransferLeader 0 node-2"}) {
		t.Errorf("calls: %v", got)
	}

	f.transferLeader = "node-0"
	chimectl(t, nil, "", "--addr", addr, "transfer-leader", "3", "node-1").
		want(t, 0, "shard 3: leader is now node-0, not node-1 (another election won)\n", "")

	f.transferErr = status.Error(codes.FailedPrecondition, `node: "node-7" is not a voter of shard 3 (voters: [node-0 node-1 node-2])`)
	chimectl(t, nil, "", "--addr", addr, "transfer-leader", "3", "node-7").
		want(t, 1, "", `chimectl: FailedPrecondition: node: "node-7" is not a voter of shard 3 (voters: [node-0 node-1 node-2])`+"\n")
}

func TestAdminUsageErrorsExit2(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{{safe: true}}}
	addr := startAdmin(t, f)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"transfer-leader", "-1", "node-1"}, "-1 is taken for a flag; to pass a negative number as an argument, put it after --"},
		{[]string{"transfer-leader", "--", "-1", "node-1"}, `SHARD "-1" is not a shard number (a non-negative integer)`},
		{[]string{"transfer-leader", "x", "node-1"}, `SHARD "x" is not a shard number (a non-negative integer)`},
		{[]string{"transfer-leader", "1.5", "node-1"}, `SHARD "1.5" is not a shard number (a non-negative integer)`},
		{[]string{"transfer-leader", "4294967296", "node-1"}, `SHARD "4294967296" is not a shard number (a non-negative integer)`},
		{[]string{"transfer-leader", "3"}, "want SHARD and NODE, got 1 arguments"},
		{[]string{"transfer-leader", "3", ""}, "the node id must not be empty"},
		{[]string{"drain", "a", "b"}, "want exactly one node id, got 2 arguments"},
		{[]string{"drain", "a", "--interval", "0s"}, "--interval must be positive"},
		{[]string{"drain", "a", "--timeout-drain", "-1s"}, "--timeout-drain must not be negative"},
		{[]string{"drain", "a", "--wait", "--no-wait"}, "--wait and --no-wait contradict each other; set one"},
		{[]string{"remove"}, "want exactly one node id, got 0 arguments"},
		{[]string{"status", "extra"}, `unexpected argument "extra"`},
		{[]string{"cluster-map", "extra"}, `unexpected argument "extra"`},
	} {
		cmd := tc.args[0]
		r := chimectl(t, nil, "", append([]string{"--addr", addr}, tc.args...)...)
		r.want(t, 2, "", "chimectl "+cmd+": "+tc.msg+"\nRun 'chimectl "+cmd+" --help' for usage.\n")
	}
	if calls := f.Calls(); len(calls) != 0 {
		t.Fatalf("usage errors reached the server: %v", calls)
	}
}

func TestRemove(t *testing.T) {
	f := &fakeAdmin{removeChanged: 4}
	addr := startAdmin(t, f)
	chimectl(t, nil, "", "--addr", addr, "remove", "node-3").
		want(t, 0, "node-3 removed; 4 shards dropped it and will place a replacement\n", "")
	chimectl(t, nil, "", "--addr", addr, "remove", "node-3", "--json").
		want(t, 0, `{"node":"node-3","shards_changed":4}`+"\n", "")
	f.removeChanged = 1
	chimectl(t, nil, "", "--addr", addr, "remove", "node-3").
		want(t, 0, "node-3 removed; 1 shard dropped it and will place a replacement\n", "")
	f.removeChanged = 0
	chimectl(t, nil, "", "--addr", addr, "remove", "node-3").
		want(t, 0, "node-3 removed; no shard had it as a voter\n", "")

	f.removeErr = status.Error(codes.FailedPrecondition, `node: "node-1" is alive; drain it instead (chimectl drain node-1), or stop it first`)
	chimectl(t, nil, "", "--addr", addr, "remove", "node-1").
		want(t, 1, "", `chimectl: FailedPrecondition: node: "node-1" is alive; drain it instead (chimectl drain node-1), or stop it first`+"\n")
	want := []string{"RemoveNode node-3", "RemoveNode node-3", "RemoveNode node-3", "RemoveNode node-3", "RemoveNode node-1"}
	if got := f.Calls(); !slices.Equal(got, want) {
		t.Errorf("calls: %v", got)
	}
}

// --force reaches the server on every call of a drain (the first, which
// the guard rail checks, and those that follow it), and only when given.
func TestDrainSendsForce(t *testing.T) {
	f := &fakeAdmin{drain: []drainStep{{replicas: 1}, {safe: true}}}
	addr := startAdmin(t, f)
	chimectlAt(t, &fakeClock{t: t0}, "--addr", addr, "drain", "node-2", "--force").want(t, 0,
		"node-2: 1 replica remaining, 0 leaderships (0s)\nnode-2 holds no replica: safe to stop\n", "")
	chimectlAt(t, &fakeClock{t: t0}, "--addr", addr, "drain", "node-2", "--no-wait").want(t, 0,
		"node-2 holds no replica: safe to stop\n", "")
	want := []string{"Drain node-2 --force", "Drain node-2 --force", "Drain node-2"}
	if got := f.Calls(); !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}

	refused := `node: "node-2" cannot be drained without leaving its shards with fewer voters than the replication factor 3: ` +
		`2 other nodes can take replicas (node-0, node-1), and one more failure could then cost a shard its quorum; ` +
		`start another node first, or drain with force (chimectl drain --force) to accept that`
	f = &fakeAdmin{drain: []drainStep{{err: status.Error(codes.FailedPrecondition, refused)}}}
	addr = startAdmin(t, f)
	chimectlAt(t, &fakeClock{t: t0}, "--addr", addr, "drain", "node-2").
		want(t, 1, "", "chimectl: FailedPrecondition: "+refused+"\n")
	if n := len(f.Calls()); n != 1 {
		t.Errorf("%d calls after a refusal, want 1", n)
	}
}

func TestRemoveSendsForce(t *testing.T) {
	f := &fakeAdmin{removeChanged: 2}
	addr := startAdmin(t, f)
	chimectl(t, nil, "", "--addr", addr, "remove", "node-3", "--force").
		want(t, 0, "node-3 removed; 2 shards dropped it and will place a replacement\n", "")
	chimectl(t, nil, "", "--addr", addr, "remove", "--force=false", "node-3").
		want(t, 0, "node-3 removed; 2 shards dropped it and will place a replacement\n", "")
	if got, want := f.Calls(), []string{"RemoveNode node-3 --force", "RemoveNode node-3"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
}

func TestClusterMap(t *testing.T) {
	m := &chimev1.ClusterMap{ShardCount: 3, Replication: 3,
		Members: []*chimev1.Member{member("node-1", "alive", time.Minute), member("node-0", "alive", time.Minute)},
		Shards: []*chimev1.Shard{
			{Id: 2, Leader: "node-1", Voters: []string{"node-0", "node-1"}, Desired: []string{"node-0", "node-1"}},
			{Id: 0, Leader: "node-0", Voters: []string{"node-0", "node-1"}, Desired: []string{"node-0", "node-1"}},
			{Id: 1, Voters: []string{"node-0", "node-1"}},
		}}
	addr := startAdmin(t, &fakeAdmin{clusterMap: m})
	chimectl(t, nil, "", "--addr", addr, "cluster-map").want(t, 0, `SHARD  LEADER  GRPC           VOTERS
0      node-0  10.0.0.0:7070  node-0*,node-1
1      -       -              node-0,node-1
2      node-1  10.0.0.1:7070  node-0,node-1*
`, "")

	r := chimectl(t, nil, "", "--addr", addr, "cluster-map", "--json")
	var got clusterMapJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 0 {
		t.Fatalf("cluster-map --json: %+v: %v", r, err)
	}
	want1 := routeJSON{ID: 1, Leader: "", LeaderGRPCAddr: "", Voters: []string{"node-0", "node-1"}, Nonvoters: []string{}, Desired: []string{}}
	if got.ShardCount != 3 || got.Replication != 3 || len(got.Members) != 2 || got.Members[0].ID != "node-0" ||
		len(got.Shards) != 3 || got.Shards[2].LeaderGRPCAddr != "10.0.0.1:7070" || !reflect.DeepEqual(got.Shards[1], want1) {
		t.Errorf("cluster-map --json: %+v", got)
	}
	if !strings.Contains(r.stdout, `"leader_grpc_addr":"10.0.0.0:7070"`) {
		t.Errorf("cluster-map --json keys: %s", r.stdout)
	}
}

func TestAdminErrorsPrintTheCode(t *testing.T) {
	// A gRPC server without the Admin service (an old chimed) answers
	// Unimplemented, and chimectl says so in its usual format.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the fake: %v", err)
		}
	}()
	t.Cleanup(func() { gs.Stop(); <-done })
	r := chimectl(t, nil, "", "--addr", ln.Addr().String(), "status")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "chimectl: Unimplemented: ") {
		t.Fatalf("status against a server without Admin: %+v", r)
	}
}

func TestOperatorHelp(t *testing.T) {
	top := chimectl(t, nil, "", "--help")
	for _, name := range []string{"status", "drain", "transfer-leader", "remove", "cluster-map"} {
		if !strings.Contains(top.stdout, "\n  "+name+"  ") {
			t.Errorf("chimectl --help does not list %s:\n%s", name, top.stdout)
		}
	}
	for cmd, wants := range map[string][]string{
		"status": {"chimectl status [flags]\n", "(none besides the global flags)", "--json", "--addr", "flagged with !"},
		"drain": {"chimectl drain [flags] [NODE]\n", "  --wait\n", "  --no-wait\n", "  --timeout-drain duration\n", "(default 5m)",
			"  --interval duration\n", "(default 1s)", "safe to stop", "exits 1",
			"  --force\n", "fewer other nodes\nthan the replication factor", "transfer-leader"},
		"transfer-leader": {"chimectl transfer-leader [flags] SHARD NODE\n", "must be one of its\nvoters"},
		"remove": {"chimectl remove [flags] NODE\n", "will NOT come back", "A node that is still alive",
			"refused", "drain it instead", "Removal cannot be undone", "wipe its data dir",
			"  --force\n", "--force or not", "chimed --dead-timeout", "will not come back"},
		"cluster-map": {"chimectl cluster-map [flags]\n", "fnv1a64(id)"},
	} {
		r := chimectl(t, nil, "", cmd, "--help")
		for _, w := range wants {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("%s --help lacks %q:\n%s", cmd, w, r.stdout)
			}
		}
	}
}
