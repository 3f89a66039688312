package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish/publishtest"
)

// TestContainerStyleCluster runs three chimed processes the way the
// container image, the compose file and the Helm chart do: configured only
// by CHIME_ variables, listening on every interface, advertising a host
// name, and all given the same --join, which names the first node. The
// first creates the cluster (its own entry skipped), the others join it;
// Raft dials the advertised name; the first restarts from its stored peers
// with the same environment; chimed health answers for a node; and a node
// drains itself with chimectl drain and no node id, as a stop hook does.
func TestContainerStyleCluster(t *testing.T) {
	t.Parallel()
	brokers := broker(t)
	port := func() string {
		_, p, _ := net.SplitHostPort(freeAddr(t))
		return p
	}
	const host = "localhost" // a name, as a pod's DNS name is
	var firstGossip string
	nodes := map[string]*daemon{}
	env := func(id string, d *daemon, grpcP, httpP, raftP, gossipP string) []string {
		return []string{
			"CHIME_NODE_ID=" + id, "CHIME_DATA_DIR=" + d.dataDir, "CHIME_KAFKA_BROKERS=" + strings.Join(brokers, ","),
			"CHIME_GRPC_ADDR=0.0.0.0:" + grpcP, "CHIME_HTTP_ADDR=0.0.0.0:" + httpP,
			"CHIME_RAFT_ADDR=0.0.0.0:" + raftP, "CHIME_GOSSIP_ADDR=0.0.0.0:" + gossipP,
			"CHIME_ADVERTISE_HOST=" + host, "CHIME_JOIN=" + firstGossip, "CHIME_INSECURE=true", "CHIME_KAFKA_AUTO_CREATE_TOPICS=true",
			fmt.Sprintf("CHIME_SHARDS=%d", clusterShards), "CHIME_DEAD_TIMEOUT=4s", "CHIME_LOG_LEVEL=warn",
		}
	}
	ids := []string{"n1", "n2", "n3"}
	ports := map[string][4]string{}
	for i, id := range ids {
		p := [4]string{port(), port(), port(), port()}
		ports[id] = p
		if i == 0 {
			firstGossip = net.JoinHostPort(host, p[3])
		}
		d := newDaemon(t, brokers)
		d.nodeID, d.grpcAddr, d.httpAddr = id, "127.0.0.1:"+p[0], "127.0.0.1:"+p[1]
		d.env = env(id, d, p[0], p[1], p[2], p[3])
		d.start()
		nodes[id] = d
	}
	c := &cluster{t: t, brokers: brokers, nodes: nodes, order: ids}
	st := c.waitConverged(60 * time.Second)

	// Every member advertises the name with its own ports.
	for _, m := range st.GetMembers() {
		p := ports[m.GetId()]
		if want := net.JoinHostPort(host, p[0]); m.GetGrpcAddr() != want {
			t.Errorf("member %s advertises gRPC %q, want %q", m.GetId(), m.GetGrpcAddr(), want)
		}
		if want := net.JoinHostPort(host, p[2]); m.GetRaftAddr() != want {
			t.Errorf("member %s advertises Raft %q, want %q", m.GetId(), m.GetRaftAddr(), want)
		}
	}
	if len(st.GetMembers()) != 3 {
		t.Errorf("%d members, want 3: %s", len(st.GetMembers()), nodetest.Describe(st))
	}

	// Events go in through one node and fire, and the ingest, voter,
	// replication and disk metrics say so.
	col := publishtest.Collect(t, brokers, "deploy.events")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := nodes["n2"].client()
	for i := range 20 {
		if _, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
			Id: fmt.Sprintf("deploy-%d", i), Topic: "deploy.events", Delay: durationpb.New(time.Second)}}); err != nil {
			t.Fatalf("schedule: %v", err)
		}
	}
	if got := col.WaitIDs(20, 30*time.Second); len(got.ByID) < 20 {
		t.Fatalf("fired %d of 20 events", len(got.ByID))
	}
	voters, ingests := 0.0, 0.0
	for _, id := range ids {
		fams := scrape(t, nodes[id])
		if v := fams["chime_replication_factor"].GetMetric(); len(v) != 1 || v[0].GetGauge().GetValue() != 3 {
			t.Errorf("%s: chime_replication_factor %v, want 3", id, v)
		}
		if v := fams["chime_data_dir_free_bytes"].GetMetric(); len(v) != 1 || v[0].GetGauge().GetValue() <= 0 {
			t.Errorf("%s: chime_data_dir_free_bytes %v, want > 0", id, v)
		}
		for _, m := range fams["chime_shard_voters"].GetMetric() {
			voters += m.GetGauge().GetValue()
		}
		for _, m := range fams["chime_ingest_seconds"].GetMetric() {
			ingests += float64(m.GetHistogram().GetSampleCount())
		}
	}
	if voters != 3*clusterShards {
		t.Errorf("the leaders report %v voters in all, want %d (3 per shard)", voters, 3*clusterShards)
	}
	if ingests == 0 {
		t.Error("chime_ingest_seconds observed no Schedule call")
	}

	// chimed health finds the node from the same environment.
	for _, args := range [][]string{{"health"}, {"health", "--ready"}} {
		cmd := exec.Command(chimedBin, args...)
		cmd.Env = nodes["n1"].cmd.Env
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "127.0.0.1:"+ports["n1"][1]) {
			t.Errorf("chimed %v: %v\n%s", args, err, out)
		}
	}

	// The first node restarts with the same environment, its --join naming
	// itself: it comes back from its stored peers and does not found a
	// second cluster.
	nodes["n1"].stop()
	nodes["n1"].start()
	c.waitConverged(60*time.Second, "n2")

	// A node drains itself: chimectl drain with no node id, at its own
	// address, as the preStop hook and the systemd unit run it. At
	// replication 3 on 3 nodes no other node can take n3's replicas, so
	// the drain is forced.
	out, err := exec.Command(chimectlBin, "--addr", nodes["n3"].grpcAddr, "drain", "--force", "--timeout-drain", "60s").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "n3 holds no replica: safe to stop") {
		t.Fatalf("chimectl drain (no node id): %v\n%s", err, out)
	}
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		st := c.status("n1")
		for _, s := range st.GetShards() {
			for _, v := range s.GetVoters() {
				if v == "n3" {
					return false, "n3 still a voter: " + nodetest.Describe(st)
				}
			}
		}
		return st != nil, "status from n1"
	})

	// Restarted, the drained node is a candidate again: /readyz?voter=1 (the
	// chart's readiness) answers 503 until the shards have taken it back as
	// a voter, which a rolling restart must wait for, then 200.
	n3 := nodes["n3"]
	n3.stop()
	n3.launch()
	// It refuses first for a shard whose leader it has not heard of yet,
	// then for the shards it is not a voter of; on a loaded machine the
	// second can pass between two polls. What a rolling restart relies on
	// is that the first 200 comes only once n3 is a voter of every shard.
	var refusals []string
	nodetest.WaitFor(t, 60*time.Second, func() (bool, string) {
		resp, err := http.Get("http://" + n3.httpAddr + "/readyz?voter=1")
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close() // read to the end above; nothing to lose
		if resp.StatusCode != http.StatusOK {
			refusals = append(refusals, string(body))
		}
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("/readyz?voter=1: %s %s", resp.Status, body)
	})
	if len(refusals) == 0 {
		t.Errorf("/readyz?voter=1 never refused while n3 was taken back")
	}
	st = c.status("n1")
	if len(st.GetShards()) == 0 {
		t.Fatalf("no shards in n1's status: %s", nodetest.Describe(st))
	}
	for _, s := range st.GetShards() {
		if !slices.Contains(s.GetVoters(), "n3") {
			t.Errorf("/readyz?voter=1 answered 200 while n3 was not a voter of shard %d (refusals before: %q): %s", s.GetId(), refusals, nodetest.Describe(st))
		}
	}
	cmd := exec.Command(chimedBin, "health", "--voter")
	cmd.Env = n3.cmd.Env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("chimed health --voter: %v\n%s", err, out)
	}
	c.waitConverged(60 * time.Second)
}

// TestServeRefusesAnUnadvertisableAddress: a node listening on every
// interface without --advertise-host would tell the others to dial [::],
// and a variable with a bad value is named in the error.
func TestServeRefusesAnUnadvertisableAddress(t *testing.T) {
	brokers := broker(t)
	for _, tc := range []struct {
		env  []string
		code int
		want string
	}{
		{[]string{"CHIME_RAFT_ADDR=0.0.0.0:0"}, 1, "--raft-addr 0.0.0.0:"},
		{[]string{"CHIME_GRPC_ADDR=0.0.0.0:0"}, 1, "give --advertise-host the host name or IP"},
		{[]string{"CHIME_SHARDS=eight"}, 2, `CHIME_SHARDS="eight": invalid value for --shards`},
	} {
		d := newDaemon(t, brokers)
		cmd := exec.Command(chimedBin, "serve", "--insecure", "--data-dir", d.dataDir, "--kafka-brokers", brokers[0],
			"--http-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0")
		cmd.Env = append(cmd.Environ(), append([]string{"CHIME_RAFT_ADDR=127.0.0.1:0", "CHIME_GRPC_ADDR=127.0.0.1:0"}, tc.env...)...)
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("%v: exit %d (%v), want %d saying %q:\n%s", tc.env, cmd.ProcessState.ExitCode(), err, tc.code, tc.want, out)
		}
	}
}

// scrape reads a node's /metrics.
func scrape(t *testing.T, d *daemon) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + d.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s/metrics: %v", d.httpAddr, err)
	}
	return fams
}
