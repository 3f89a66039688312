package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/backup"
	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
)

// TestBackupRestoreIntoANewCluster backs a live 3-process cluster up with the
// chimectl binary, stops it, restores the backup with chimed restore into a
// new data directory and starts a new cluster on it, against a new broker:
//
//   - events fired before the backup are not produced again, and Get shows
//     them fired;
//   - events cancelled before the backup never fire, and Get shows them
//     cancelled;
//   - events that fell due while no cluster ran fire as soon as the restored
//     node starts;
//   - events due later fire at their due time, not before;
//
// and a second node joins the restored one and serves its shards. Every
// shard holds events of each kind, so a restore that lost a shard, or
// planted one at the wrong index, fails it. The backup is signed
// (--backup-key-file); before the real restore, chimed restore refuses it
// without the key, with its manifest changed, stripped of its signature,
// and against reserved topics that its events target.
func TestBackupRestoreIntoANewCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-process cluster, backs it up and restores it into a new one; skipped with -short")
	}
	t.Parallel()
	const topic = "restore.events"
	c := newCluster(t, 3, "--retention", "36h")
	c.waitSettled(30 * time.Second)
	col := collect(t, c.brokers, topic)
	cl := c.nodes["n2"].client()
	ctx := context.Background()

	// The timeline, from now: the early events fire on the old cluster
	// within a second; the backup is taken; the old cluster stops before
	// outageDue, and the restored one starts after it; the late events are
	// due once the restored cluster runs.
	const (
		perGroup  = 240
		outageDue = 15 * time.Second
		lateDue   = 35 * time.Second
	)
	start := time.Now()
	due := map[string]time.Time{}
	group := map[string][]string{}
	schedule := func(name string, delay func(i int) time.Duration) {
		req := &chimev1.BatchScheduleRequest{}
		for i := range perGroup {
			id := fmt.Sprintf("%s-%d", name, i)
			req.Events = append(req.Events, &chimev1.Event{Id: id, Topic: topic, Delay: durationpb.New(delay(i)), Payload: []byte("payload-" + id)})
		}
		resp, err := cl.BatchSchedule(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Results {
			if r.Code != 0 {
				t.Fatalf("%s: %d %s", r.Id, r.Code, r.Message)
			}
			due[r.Id] = r.Due.AsTime()
			group[name] = append(group[name], r.Id)
		}
	}
	spread := func(from time.Duration) func(int) time.Duration {
		return func(i int) time.Duration { return from + time.Duration(i)*time.Second/perGroup }
	}
	schedule("early", spread(0))
	schedule("cancelled", spread(outageDue))
	schedule("outage", spread(outageDue))
	schedule("late", spread(lateDue))
	for _, g := range [][]string{group["early"], group["cancelled"], group["outage"], group["late"]} {
		shards := map[uint32]bool{}
		for _, id := range g {
			shards[shard.For(id, clusterShards)] = true
		}
		if len(shards) != clusterShards {
			t.Fatalf("a group covers %d of %d shards", len(shards), clusterShards)
		}
	}
	for _, id := range group["cancelled"] {
		r, err := retried(func() (*chimev1.CancelResponse, error) { return cl.Cancel(ctx, &chimev1.CancelRequest{Id: id}) })
		if err != nil || r.State != chimev1.EventState_EVENT_STATE_CANCELLED {
			t.Fatalf("cancel %s: %v %v", id, r, err)
		}
	}
	early := map[string]time.Time{}
	for _, id := range group["early"] {
		early[id] = due[id]
	}
	col.waitIDs(t, early, 30*time.Second)
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		for _, id := range group["early"] {
			if g, err := cl.Get(ctx, &chimev1.GetRequest{Id: id}); err != nil || g.State != chimev1.EventState_EVENT_STATE_FIRED {
				return false, fmt.Sprintf("%s marked fired: %v %v", id, g.GetState(), err)
			}
		}
		return true, ""
	})

	// The backup, through n1, which relays the shards it does not lead,
	// signed with a key of the operator's.
	dir := filepath.Join(t.TempDir(), "backup")
	keyFile := filepath.Join(t.TempDir(), "backup.key")
	if err := os.WriteFile(keyFile, []byte("dGhlIGJhY2t1cCBrZXkgb2YgdGhlIHJlc3RvcmUgdGVzdA==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	bc := exec.Command(chimectlBin, "--addr", c.nodes["n1"].grpcAddr, "backup", "--out", dir, "--json", "--backup-key-file", keyFile)
	bc.Stdout, bc.Stderr = &stdout, &stderr
	if err := bc.Run(); err != nil {
		t.Fatalf("chimectl backup: %v\n%s", err, stderr.String())
	}
	backedUp := time.Now()
	var m backup.Manifest
	if err := json.Unmarshal(stdout.Bytes(), &m); err != nil {
		t.Fatalf("backup --json: %v\n%s", err, stdout.String())
	}
	var from []string
	for _, s := range m.Shards {
		from = append(from, s.Node)
	}
	if m.ShardCount != clusterShards || m.Retention != 36*time.Hour || !slices.Contains(from, "n1") || !slices.ContainsFunc(from, func(n string) bool { return n != "n1" }) {
		t.Fatalf("manifest: %d shards, retention %v, copied from %v (want some from n1 and some relayed)\n%s", m.ShardCount, m.Retention, from, stderr.String())
	}
	if m.ClusterID == "" || len(m.HMAC) != 64 || strings.Contains(stderr.String(), "unsigned") {
		t.Fatalf("manifest: cluster id %q, hmac %q: want the cluster named and the manifest signed\n%s", m.ClusterID, m.HMAC, stderr.String())
	}
	if !strings.Contains(stderr.String(), fmt.Sprintf("shard %d/%d: ", clusterShards-1, clusterShards)) {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
	}
	if backedUp.After(start.Add(outageDue - 2*time.Second)) {
		t.Fatalf("the backup ended %v after the events were scheduled, too close to the outage events' due time (%v): the test's timeline does not hold", backedUp.Sub(start), outageDue)
	}
	t.Logf("backed up %d shards in %v", len(m.Shards), backedUp.Sub(start))
	for _, id := range c.order {
		c.nodes[id].stop()
	}

	// While the outage goes on: what chimed restore refuses, by name, each
	// time leaving its data directory as it found it.
	refused := func(want string, args ...string) {
		t.Helper()
		data := filepath.Join(t.TempDir(), "data")
		var out bytes.Buffer
		rc := exec.Command(chimedBin, append([]string{"restore", "--data-dir", data, "--node-id", "x", "--raft-addr", "127.0.0.1:7999"}, args...)...)
		rc.Stdout, rc.Stderr = &out, &out
		err := rc.Run()
		if rc.ProcessState.ExitCode() != 1 || !strings.Contains(out.String(), want) {
			t.Errorf("chimed restore %q: %v\n%s\nwant exit 1 saying %q", args, err, out.String(), want)
		}
		if left, _ := os.ReadDir(data); len(left) > 1 || len(left) == 1 && left[0].Name() != "chimed.lock" {
			t.Errorf("chimed restore %q, refused, left %v in its data directory", args, left)
		}
	}
	copyWith := func(name string, edit func(m map[string]any)) string {
		d := filepath.Join(t.TempDir(), name)
		if err := os.CopyFS(d, os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(d, backup.ManifestName)
		raw, _ := os.ReadFile(path)
		var man map[string]any
		if err := json.Unmarshal(raw, &man); err != nil {
			t.Fatal(err)
		}
		edit(man)
		raw, _ = json.Marshal(man)
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	tampered := copyWith("tampered", func(m map[string]any) { m["cluster_id"] = "c-forged" })
	unsigned := copyWith("unsigned", func(m map[string]any) { delete(m, "hmac_sha256") })
	refused("chimed restore: backup "+dir+": manifest.json: signed (hmac_sha256), and no key to check it with: pass --backup-key-file", "--from", dir)
	refused("chimed restore: backup "+unsigned+": manifest.json: unsigned (no hmac_sha256): pass --backup-key-file to restore a signed backup, or --allow-unsigned", "--from", unsigned)
	refused("chimed restore: backup "+unsigned+": manifest.json: unsigned (no hmac_sha256), and a restore with --backup-key-file takes only a signed backup", "--from", unsigned, "--backup-key-file", keyFile)
	refused("chimed restore: backup "+tampered+": manifest.json: hmac_sha256 does not verify with the backup key", "--from", tampered, "--backup-key-file", keyFile)
	refused(`targets the reserved topic "restore.events": it matches the reserved pattern "restore.*" (--allow-topic restore.events restores it all the same)`,
		"--from", dir, "--backup-key-file", keyFile, "--reserved-topics", "restore.*")

	// The outage: the outage events fall due while no node runs.
	time.Sleep(time.Until(start.Add(outageDue + time.Second + 100*time.Millisecond))) // pacing: no node runs to wait on
	brokers := broker(t)
	r1 := newDaemon(t, brokers)
	r1.nodeID = "r1"
	r1.extra = []string{"--dead-timeout", "4s"}
	var out bytes.Buffer
	rc := exec.Command(chimedBin, "restore", "--from", dir, "--backup-key-file", keyFile, "--data-dir", r1.dataDir, "--node-id", "r1", "--raft-addr", r1.raftAd)
	rc.Stdout, rc.Stderr = &out, &out
	if err := rc.Run(); err != nil {
		t.Fatalf("chimed restore: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		fmt.Sprintf("backup of cluster %s: %d shards, taken ", m.ClusterID, clusterShards),
		"; manifest signed, and its HMAC verified with the backup key\n",
		fmt.Sprintf("restored %d shards into %s as node \"r1\" (replication 3, settled events kept 36h0m0s), from the backup of cluster %s taken ", clusterShards, r1.dataDir, m.ClusterID),
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("chimed restore does not say %q:\n%s", want, out.String())
		}
	}
	col2 := collect(t, brokers, topic)
	launched := time.Now()
	r1.start()
	rcl := r1.client()

	pending := map[string]time.Time{}
	for _, id := range append(slices.Clone(group["outage"]), group["late"]...) {
		pending[id] = due[id]
	}
	got := col2.waitIDs(t, pending, lateDue+30*time.Second)
	var outageLate time.Duration
	for id, at := range pending {
		r := got[id]
		if r.Fired.UnixMilli() < at.UnixMilli() {
			t.Errorf("%s fired early: due %v, fired %v", id, at, r.Fired)
		}
		if r.Value() != "payload-"+id {
			t.Errorf("%s: value %q", id, r.Value())
		}
		if strings.HasPrefix(id, "outage-") {
			outageLate = max(outageLate, r.Fired.Sub(launched))
		}
	}
	if outageLate > 15*time.Second {
		t.Errorf("an event due during the outage fired %v after the restored node was started", outageLate)
	}
	t.Logf("the restored node fired the %d outage events within %v of its start, and the %d late ones on time", len(group["outage"]), outageLate.Round(time.Millisecond), len(group["late"]))
	all, _ := col2.byID()
	for _, id := range append(slices.Clone(group["early"]), group["cancelled"]...) {
		if r, ok := all[id]; ok {
			t.Errorf("%s, settled before the backup, was produced again by the restored cluster at %v", id, r.Fired)
		}
	}
	if len(all) != len(pending) {
		t.Errorf("the restored cluster produced %d distinct events, want %d", len(all), len(pending))
	}

	// A second node joins the restored one, takes replicas of its shards,
	// and answers for them.
	r2 := newDaemon(t, brokers)
	r2.nodeID = "r2"
	r2.extra = []string{"--dead-timeout", "4s"}
	r2.join = []string{r1.gossipAddr}
	r2.start()
	restored := &cluster{t: t, brokers: brokers, nodes: map[string]*daemon{"r1": r1, "r2": r2}, order: []string{"r1", "r2"}}
	st := restored.waitConverged(60 * time.Second)
	for _, s := range st.Shards {
		if len(s.Voters) != 2 {
			t.Errorf("shard %d: voters %v, want r1 and r2", s.Id, s.Voters)
		}
	}
	want := map[string]chimev1.EventState{}
	for _, id := range group["early"] {
		want[id] = chimev1.EventState_EVENT_STATE_FIRED
	}
	for _, id := range group["cancelled"] {
		want[id] = chimev1.EventState_EVENT_STATE_CANCELLED
	}
	for _, id := range group["late"] {
		want[id] = chimev1.EventState_EVENT_STATE_FIRED
	}
	r2cl := r2.client()
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		for id, state := range want {
			for _, cl := range []chimev1.SchedulerClient{rcl, r2cl} {
				if g, err := cl.Get(ctx, &chimev1.GetRequest{Id: id}); err != nil || g.State != state {
					return false, fmt.Sprintf("Get %s: %v %v, want %v", id, g.GetState(), err, state)
				}
			}
		}
		return true, ""
	})
	cm, err := restored.admin("r2").GetClusterMap(ctx, &chimev1.GetClusterMapRequest{})
	if err != nil || cm.ShardCount != clusterShards || cm.Retention.AsDuration() != 36*time.Hour {
		t.Fatalf("cluster map of the restored cluster: %v %v", cm, err)
	}
	for _, d := range []*daemon{r2, r1} {
		d.stop()
	}
}
