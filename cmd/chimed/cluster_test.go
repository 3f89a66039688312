package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
)

// The cluster tests run real chimed processes on loopback (Raft transport,
// memberlist gossip, gRPC) against a kfake broker in the test process, with
// acknowledged events in flight through every change, and check afterwards
// that every one of them reached Kafka and none early.

const clusterShards = 8

// cluster is a set of chimed processes forming one cluster.
type cluster struct {
	t       testing.TB
	brokers []string
	nodes   map[string]*daemon
	order   []string
}

func newCluster(t testing.TB, n int, extra ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, brokers: broker(t), nodes: map[string]*daemon{}}
	for i := range n {
		c.add(fmt.Sprintf("n%d", i+1), extra...)
	}
	c.waitConverged(30 * time.Second)
	return c
}

// add starts one more node; every node after the first joins the first.
func (c *cluster) add(id string, extra ...string) *daemon {
	c.t.Helper()
	d := newDaemon(c.t, c.brokers)
	d.nodeID = id
	d.extra = append([]string{"--shards", fmt.Sprint(clusterShards), "--dead-timeout", "4s"}, extra...)
	if len(c.order) > 0 {
		d.join = []string{c.nodes[c.order[0]].gossipAddr}
	}
	d.start()
	c.nodes[id] = d
	c.order = append(c.order, id)
	return d
}

func (c *cluster) admin(id string) chimev1.AdminClient {
	c.t.Helper()
	cc, err := grpc.NewClient(c.nodes[id].grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cc.Close() })
	return chimev1.NewAdminClient(cc)
}

// status asks node id for the cluster's status.
func (c *cluster) status(id string) *chimev1.StatusResponse {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.admin(id).Status(ctx, &chimev1.StatusRequest{})
	if err != nil {
		return nil
	}
	return st
}

// converged reports whether every shard has a leader and exactly its desired
// voters, with no non-voter left.
func converged(st *chimev1.StatusResponse) bool {
	if st == nil || len(st.Shards) != clusterShards {
		return false
	}
	for _, s := range st.Shards {
		if s.Leader == "" || len(s.Nonvoters) > 0 || len(s.Desired) == 0 {
			return false
		}
		if !sameSet(s.Voters, s.Desired) {
			return false
		}
	}
	return true
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// waitConverged waits until the status from the first live node shows every
// shard on its desired voters, and returns it.
func (c *cluster) waitConverged(d time.Duration, from ...string) *chimev1.StatusResponse {
	c.t.Helper()
	if len(from) == 0 {
		from = c.order[:1]
	}
	deadline := time.Now().Add(d)
	var st *chimev1.StatusResponse
	for time.Now().Before(deadline) {
		if st = c.status(from[0]); converged(st) {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("cluster did not converge within %v; last status: %v", d, describe(st))
	return nil
}

// waitSettled waits until the cluster has converged and every shard is led by
// its preferred leader, so no balancing transfer is still to come.
func (c *cluster) waitSettled(d time.Duration) *chimev1.StatusResponse {
	c.t.Helper()
	deadline := time.Now().Add(d)
	var st *chimev1.StatusResponse
	for time.Now().Before(deadline) {
		st = c.status(c.order[0])
		settled := converged(st)
		for _, s := range st.GetShards() {
			settled = settled && s.Leader == s.Desired[0]
		}
		if settled {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("cluster did not settle on its preferred leaders within %v: %s", d, describe(st))
	return nil
}

func describe(st *chimev1.StatusResponse) string {
	if st == nil {
		return "<none>"
	}
	s := ""
	for _, m := range st.Members {
		s += fmt.Sprintf("[%s %s] ", m.Id, m.State)
	}
	for _, sh := range st.Shards {
		s += fmt.Sprintf("\n  shard %d leader=%q voters=%v nonvoters=%v desired=%v", sh.Id, sh.Leader, sh.Voters, sh.Nonvoters, sh.Desired)
	}
	return s
}

func leaderCounts(st *chimev1.StatusResponse) map[string]int {
	n := map[string]int{}
	for _, s := range st.Shards {
		n[s.Leader]++
	}
	return n
}

// workload schedules events through every node, with due times spread over
// the next spread, and returns their due times by id.
func (c *cluster) workload(prefix string, n int, spread time.Duration) map[string]time.Time {
	c.t.Helper()
	due := map[string]time.Time{}
	r := rand.New(rand.NewPCG(uint64(n), uint64(len(prefix))))
	for b := 0; b < n; b += 100 {
		d := c.nodes[c.order[(b/100)%len(c.order)]]
		req := &chimev1.BatchScheduleRequest{}
		for i := b; i < min(b+100, n); i++ {
			req.Events = append(req.Events, &chimev1.Event{
				Id: fmt.Sprintf("%s-%d", prefix, i), Topic: "cluster.events",
				Delay: durationpb.New(time.Duration(r.Int64N(int64(spread)))),
			})
		}
		resp, err := d.client().BatchSchedule(context.Background(), req)
		if err != nil {
			c.t.Fatalf("BatchSchedule via %s: %v", d.nodeID, err)
		}
		for _, res := range resp.Results {
			if res.Code != 0 {
				c.t.Fatalf("%s: %d %s", res.Id, res.Code, res.Message)
			}
			due[res.Id] = res.Due.AsTime()
		}
	}
	return due
}

// checkFired waits for every acknowledged event and checks none was early.
func checkFired(t testing.TB, col *collector, due map[string]time.Time) {
	t.Helper()
	got := col.waitIDs(t, due, 60*time.Second)
	for id, at := range due {
		if got[id].Fired.UnixMilli() < at.UnixMilli() {
			t.Errorf("%s fired early: due %v, fired %v", id, at, got[id].Fired)
		}
	}
	_, dups := col.byID()
	t.Logf("all %d acknowledged events fired, none early; %d duplicates", len(due), dups)
}

func TestClusterLeaderKilled(t *testing.T) {
	c := newCluster(t, 3)
	col := collect(t, c.brokers, "cluster.events")
	st := c.waitConverged(30 * time.Second)
	counts := leaderCounts(st)
	victim := c.order[0]
	for _, id := range c.order {
		if counts[id] > counts[victim] {
			victim = id
		}
	}
	var led []uint32
	for _, s := range st.Shards {
		if s.Leader == victim {
			led = append(led, s.Id)
		}
	}
	due := c.workload("kill", 3000, 8*time.Second)
	survivor := c.order[0]
	if survivor == victim {
		survivor = c.order[1]
	}
	time.Sleep(time.Second) // some events fired before the kill, some after
	c.nodes[victim].kill()
	killed := time.Now()

	// Every shard the victim led gets a new leader within 3 s.
	var recovered time.Duration
	for {
		st := c.status(survivor)
		ok := st != nil
		for _, id := range led {
			if !ok {
				break
			}
			l := st.Shards[id].Leader
			ok = l != "" && l != victim
		}
		if ok {
			recovered = time.Since(killed)
			break
		}
		if time.Since(killed) > 3*time.Second {
			t.Fatalf("shards %v led by the killed %s have no new leader 3s after the kill: %s", led, victim, describe(st))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("killed %s, which led shards %v; all had new leaders after %v", victim, led, recovered.Round(time.Millisecond))

	// Those shards fire again within 3 s of the kill: an event due just
	// after the kill on one of them reaches Kafka by then.
	checkFired(t, col, due)
	recs, _ := col.byID()
	var worst time.Duration
	for id, at := range due {
		if !slices.Contains(led, shard.For(id, clusterShards)) || at.Before(killed) || at.After(killed.Add(time.Second)) {
			continue
		}
		worst = max(worst, recs[id].Fired.Sub(killed))
	}
	if worst > 3*time.Second {
		t.Errorf("an event due within 1s after the kill on a shard the victim led fired %v after the kill", worst)
	}
	t.Logf("events due in the first second after the kill on the victim's shards fired at most %v after it", worst.Round(time.Millisecond))
}

func TestClusterNodeJoins(t *testing.T) {
	c := newCluster(t, 3)
	col := collect(t, c.brokers, "cluster.events")
	due := c.workload("join", 2000, 10*time.Second)
	c.add("n4")
	st := c.waitConverged(60*time.Second, "n4")
	holds := 0
	for _, s := range st.Shards {
		if slices.Contains(s.Voters, "n4") {
			holds++
		}
	}
	if holds == 0 {
		t.Fatalf("the new node holds no replica: %s", describe(st))
	}
	// Leaders end balanced within one of even (the balancer acts for a
	// while after the membership change).
	even := float64(clusterShards) / 4
	deadline := time.Now().Add(30 * time.Second)
	for {
		counts := leaderCounts(st)
		balanced := len(counts) == 4
		for _, n := range counts {
			if float64(n) < even-1 || float64(n) > even+1 {
				balanced = false
			}
		}
		if balanced {
			t.Logf("after n4 joined: it holds %d replicas; leaders per node %v", holds, counts)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaders not balanced within one of %v: %v", even, counts)
		}
		time.Sleep(200 * time.Millisecond)
		if s := c.status("n4"); converged(s) {
			st = s
		}
	}
	checkFired(t, col, due)
}

func TestClusterDrain(t *testing.T) {
	c := newCluster(t, 3)
	col := collect(t, c.brokers, "cluster.events")
	due := c.workload("drain", 2000, 10*time.Second)
	target := c.order[2]
	adm := c.admin(c.order[0]) // any node answers and forwards
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := adm.Drain(context.Background(), &chimev1.DrainRequest{Node: target})
		if err == nil && resp.SafeToStop {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drain of %s not safe after 60s: %v %v", target, resp, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Wait also for the balancer to finish moving leaders to the preferred
	// ones (a transfer bumps the Raft term too): from then on, any term
	// change would be an election caused by the stop.
	before := c.waitSettled(30 * time.Second)
	for _, s := range before.Shards {
		if slices.Contains(s.Voters, target) || slices.Contains(s.Nonvoters, target) || s.Leader == target {
			t.Fatalf("drained %s still in shard %d: %s", target, s.Id, describe(before))
		}
	}
	terms := c.terms(c.order[0], c.order[1])
	c.nodes[target].stop()
	time.Sleep(3 * time.Second) // longer than an election timeout
	after := c.status(c.order[0])
	for i, s := range after.Shards {
		if s.Leader != before.Shards[i].Leader {
			t.Errorf("shard %d: leader changed from %s to %s after the drained node stopped", s.Id, before.Shards[i].Leader, s.Leader)
		}
	}
	if now := c.terms(c.order[0], c.order[1]); !maps.Equal(now, terms) {
		t.Errorf("Raft terms changed after the drained node stopped (an election happened): %v -> %v", terms, now)
	}
	checkFired(t, col, due)
}

// terms returns each replica's Raft term on the given nodes.
func (c *cluster) terms(nodes ...string) map[string]uint64 {
	c.t.Helper()
	out := map[string]uint64{}
	for _, n := range nodes {
		st, err := c.admin(n).NodeStatus(context.Background(), &chimev1.NodeStatusRequest{})
		if err != nil {
			c.t.Fatal(err)
		}
		for _, r := range st.Replicas {
			out[fmt.Sprintf("%s/%d", n, r.Shard)] = r.Term
		}
	}
	return out
}

func TestClusterDeadNodeReplaced(t *testing.T) {
	c := newCluster(t, 4)
	col := collect(t, c.brokers, "cluster.events")
	due := c.workload("dead", 2000, 12*time.Second)
	st := c.waitConverged(30 * time.Second)
	victim := ""
	for _, id := range c.order[1:] {
		for _, s := range st.Shards {
			if slices.Contains(s.Voters, id) {
				victim = id
			}
		}
	}
	c.nodes[victim].kill()
	// Past the 4 s dead timeout, every shard is back to three voters, none
	// of them the dead node.
	deadline := time.Now().Add(60 * time.Second)
	for {
		st = c.status(c.order[0])
		ok := converged(st)
		for _, s := range st.GetShards() {
			ok = ok && len(s.Voters) == 3 && !slices.Contains(s.Voters, victim)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shards not back to three live voters 60s after %s died: %s", victim, describe(st))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s died; every shard back to three voters without it", victim)
	checkFired(t, col, due)
}

// BenchmarkIdleCluster measures what an idle 3-node cluster with default
// settings costs: each node's CPU time (process_cpu_seconds_total) over 30 s
// with no requests, as a percentage of one core.
//
//	go test -run '^$' -bench IdleCluster -benchtime 1x ./cmd/chimed/
func BenchmarkIdleCluster(b *testing.B) {
	c := newCluster(b, 3)
	c.waitConverged(30 * time.Second)
	time.Sleep(5 * time.Second) // let the balancer and the first snapshots settle
	const window = 30 * time.Second
	before := map[string]float64{}
	for _, id := range c.order {
		before[id] = c.nodes[id].cpuSeconds()
	}
	b.ResetTimer()
	time.Sleep(window)
	worst := 0.0
	for _, id := range c.order {
		pct := (c.nodes[id].cpuSeconds() - before[id]) / window.Seconds() * 100
		b.Logf("%s: %.2f%% of one core", id, pct)
		worst = max(worst, pct)
	}
	b.ReportMetric(worst, "max-cpu%/node")
}

// cpuSeconds is the node's CPU time so far, process_cpu_seconds_total of
// its /metrics (the Prometheus process collector).
func (d *daemon) cpuSeconds() float64 {
	d.t.Helper()
	resp, err := http.Get("http://" + d.httpAddr + "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		d.t.Fatalf("%s/metrics: %v", d.httpAddr, err)
	}
	m := fams["process_cpu_seconds_total"].GetMetric()
	if len(m) == 0 {
		d.t.Fatalf("%s/metrics has no process_cpu_seconds_total", d.httpAddr)
	}
	return m[0].GetCounter().GetValue()
}

// TestClusterRestartWithoutQuorum is the regression test for a node the
// fault tests saw exit: restarted while its peers were down, it gave up
// waiting for shard leaders and quit, which kept those shards without a
// quorum after the peers came back. A node must keep serving.
func TestClusterRestartWithoutQuorum(t *testing.T) {
	c := newCluster(t, 3)
	col := collect(t, c.brokers, "cluster.events")
	due := c.workload("noquorum", 600, 20*time.Second)
	for _, id := range c.order {
		c.nodes[id].kill()
	}
	first := c.nodes[c.order[0]]
	first.extra = append(first.extra, "--startup-wait", "1s")
	first.launch()
	first.waitHTTP("/healthz", 30*time.Second)
	time.Sleep(3 * time.Second) // well past --startup-wait, with no quorum anywhere
	select {
	case <-first.exited:
		t.Fatalf("%s exited while its shards had no quorum: %s", first.nodeID, first.stderr)
	default:
	}
	for _, id := range c.order[1:] {
		c.nodes[id].start()
	}
	c.waitConverged(60 * time.Second)
	checkFired(t, col, due)
}

// TestClusterSeedRestartsAlone is the regression test for a membership
// island: the first node (started without --join) was restarted after the
// others had declared it dead, formed a view of its own, and never merged
// back. The members reconnect to it.
func TestClusterSeedRestartsAlone(t *testing.T) {
	c := newCluster(t, 3)
	seed := c.nodes[c.order[0]]
	seed.kill()
	other := c.order[1]
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := c.status(other)
		dead := false
		for _, m := range st.GetMembers() {
			dead = dead || (m.Id == seed.nodeID && m.State == "dead")
		}
		if dead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never saw %s dead: %s", other, seed.nodeID, describe(st))
		}
		time.Sleep(200 * time.Millisecond)
	}
	seed.start() // as before: no --join
	deadline = time.Now().Add(30 * time.Second)
	for {
		st := c.status(seed.nodeID)
		alive := 0
		for _, m := range st.GetMembers() {
			if m.State == "alive" {
				alive++
			}
		}
		if alive == 3 && converged(st) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted seed did not rejoin the others: %s", describe(st))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestClusterPausedLeaderProducesNothingAfterCancel is the regression test
// for a cancel violation the fault tests found: a leader paused (SIGSTOP)
// past its lease resumed and produced events that the new leader had
// already cancelled, because it fired from its own stale state before Raft
// told it that it had been deposed.
func TestClusterPausedLeaderProducesNothingAfterCancel(t *testing.T) {
	c := newCluster(t, 3)
	col := collect(t, c.brokers, "cluster.paused")
	st := c.waitSettled(30 * time.Second)
	const s = 0
	leader := st.Shards[s].Leader
	other := c.order[0]
	if other == leader {
		other = c.order[1]
	}
	// Events on the leader's shard, due while it will be paused.
	var ids []string
	for i := 0; len(ids) < 50; i++ {
		if id := fmt.Sprintf("paused-%d", i); shard.For(id, clusterShards) == s {
			ids = append(ids, id)
		}
	}
	req := &chimev1.BatchScheduleRequest{}
	// Due times spread across the moment the leader resumes, so its
	// firing loop has work the instant it runs again.
	for i, id := range ids {
		d := 9*time.Second + time.Duration(i)*40*time.Millisecond
		req.Events = append(req.Events, &chimev1.Event{Id: id, Topic: "cluster.paused", Delay: durationpb.New(d)})
	}
	scheduled := time.Now()
	if _, err := c.nodes[other].client().BatchSchedule(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	c.nodes[leader].cmd.Process.Signal(syscall.SIGSTOP)
	defer c.nodes[leader].cmd.Process.Signal(syscall.SIGCONT)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if st := c.status(other); st != nil && st.Shards[s].Leader != "" && st.Shards[s].Leader != leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader for shard %d while %s was paused", s, leader)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, id := range ids {
		if _, err := c.nodes[other].client().Cancel(context.Background(), &chimev1.CancelRequest{Id: id}); err != nil {
			t.Fatalf("cancel %s: %v", id, err)
		}
	}
	time.Sleep(time.Until(scheduled.Add(10 * time.Second))) // half of them are past due
	c.nodes[leader].cmd.Process.Signal(syscall.SIGCONT)
	time.Sleep(3 * time.Second)
	got, _ := col.byID()
	for _, id := range ids {
		if r, ok := got[id]; ok {
			t.Errorf("%s was produced at %v after its cancel was acknowledged", id, r.Fired)
		}
	}
}
