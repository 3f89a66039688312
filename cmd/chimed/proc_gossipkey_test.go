package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/membership"
	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// TestGossipKeysRefuseStrangersAndRotateLive runs three chimed processes
// with --gossip-key-file and shows: a node without the key and a node with
// another key never become members (and both say why in their logs, as do
// the members); a key file that does not parse is logged and counted and
// the keys in use kept; the three-step rotation, done by rewriting each
// node's file while it runs, reaches every node without a member ever being
// lost; afterwards a node with only the old key is refused, one with the new
// key joins, and events still fire.
func TestGossipKeysRefuseStrangersAndRotateLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-process cluster and five more nodes; skipped with -short")
	}
	t.Parallel()
	dir := t.TempDir()
	k1, k2, other := newGossipKey(t), newGossipKey(t), newGossipKey(t)
	keyFile := func(id string) string { return filepath.Join(dir, id+".keys") }
	c := &cluster{t: t, brokers: broker(t), nodes: map[string]*daemon{}}
	ids := []string{"n1", "n2", "n3"}
	for _, id := range ids {
		writeGossipKeys(t, keyFile(id), k1)
		c.add(id, "--gossip-key-file", keyFile(id))
	}
	c.waitConverged(30 * time.Second)
	defer func() {
		if t.Failed() {
			for _, id := range c.order {
				t.Logf("%s stderr:\n%s", id, tail(c.nodes[id].stderr.String(), 3000))
			}
		}
	}()
	// Since records when each node last became alive in every node's view:
	// a member lost and back during the rotation would have a later one.
	since := map[string]map[string]time.Time{}
	for _, id := range ids {
		since[id] = membersSince(t, c, id)
	}
	stillTogether := func(step string) {
		t.Helper()
		for _, id := range ids {
			got := membersSince(t, c, id)
			for _, m := range ids {
				if !got[m].Equal(since[id][m]) {
					t.Fatalf("%s: %s sees %s alive since %v, before since %v: it was lost meanwhile", step, id, m, got[m], since[id][m])
				}
			}
		}
	}

	// Strangers: they retry their join for 30 s and then exit; well before
	// that, their log says why, and nobody lists them.
	for _, s := range []struct {
		id, say string
		keys    [][]byte
	}{
		{"plain", "remote state is encrypted and encryption is not configured", nil},
		{"stranger", "no installed keys could decrypt the message", [][]byte{other}},
	} {
		d := newDaemon(t, c.brokers)
		d.nodeID, d.join = s.id, []string{c.nodes["n1"].gossipAddr}
		d.extra = []string{"--shards", fmt.Sprint(clusterShards)}
		if s.keys != nil {
			writeGossipKeys(t, keyFile(s.id), s.keys...)
			d.extra = append(d.extra, "--gossip-key-file", keyFile(s.id))
		}
		d.launch()
		nodetest.WaitFor(t, 15*time.Second, func() (bool, string) {
			log := d.stderr.String()
			return strings.Contains(log, s.say) && strings.Contains(log, "gossip keys and this node's do not match"),
				s.id + " logs why its join fails: " + log
		})
		d.kill()
		for _, id := range ids {
			if _, ok := membersSince(t, c, id)[s.id]; ok {
				t.Fatalf("%s lists %s, which has not the cluster's key, as a member", id, s.id)
			}
		}
	}
	if log := c.nodes["n1"].stderr.String(); !strings.Contains(log, "gossip dropped: its sender does not share this node's gossip keys") {
		t.Errorf("the seed n1 does not warn about the gossip it dropped:\n%s", tail(log, 3000))
	}

	// A key file that does not parse changes nothing.
	n1 := c.nodes["n1"]
	if err := os.WriteFile(keyFile("n1"), []byte(base64.StdEncoding.EncodeToString(k1)+"\nnot a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		_, errs := gossipKeyMetrics(t, n1)
		return errs == 1, fmt.Sprintf("n1 counts the bad key file (chime_gossip_key_file_errors_total %v)", errs)
	})
	if keys, _ := gossipKeyMetrics(t, n1); !slices.Equal(keys, keyInfo(k1)) {
		t.Fatalf("n1 uses keys %v after a bad key file, want %v", keys, keyInfo(k1))
	}
	if log := n1.stderr.String(); !strings.Contains(log, keyFile("n1")+": line 2: not a base64 key") {
		t.Errorf("n1's log does not name the bad line:\n%s", tail(log, 3000))
	}

	// The rotation, each step on every node before the next.
	for _, step := range []struct {
		name string
		keys [][]byte
	}{
		{"1 add k2", [][]byte{k1, k2}},
		{"2 make k2 the primary", [][]byte{k2, k1}},
		{"3 remove k1", [][]byte{k2}},
	} {
		for _, id := range ids {
			writeGossipKeys(t, keyFile(id), step.keys...)
		}
		for _, id := range ids {
			nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
				keys, _ := gossipKeyMetrics(t, c.nodes[id])
				return slices.Equal(keys, keyInfo(step.keys...)), fmt.Sprintf("step %s: %s uses %v", step.name, id, keys)
			})
		}
		stillTogether(step.name)
	}

	// Only k2 opens the cluster now.
	old := newDaemon(t, c.brokers)
	old.nodeID, old.join = "old", []string{n1.gossipAddr}
	writeGossipKeys(t, keyFile("old"), k1)
	old.extra = []string{"--shards", fmt.Sprint(clusterShards), "--gossip-key-file", keyFile("old")}
	old.launch()
	nodetest.WaitFor(t, 15*time.Second, func() (bool, string) {
		return strings.Contains(old.stderr.String(), "gossip keys and this node's do not match"), "a node with the rotated-out key is refused: " + old.stderr.String()
	})
	old.kill()
	writeGossipKeys(t, keyFile("n4"), k2)
	c.add("n4", "--gossip-key-file", keyFile("n4"))
	for _, id := range ids {
		nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
			_, ok := membersSince(t, c, id)["n4"]
			return ok, id + " lists n4, which joined with the new key"
		})
	}
	stillTogether("n4 joined")

	// And the cluster does its job: an event scheduled through a node that
	// may not lead its shard fires.
	got := collect(t, c.brokers, "gossip.keys")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want := map[string]time.Time{}
	for i, id := range ids {
		ev := fmt.Sprintf("after-rotation-%d", i)
		if _, err := c.nodes[id].client().Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
			Id: ev, Topic: "gossip.keys", Payload: []byte("x"), Delay: durationpb.New(500 * time.Millisecond)}}); err != nil {
			t.Fatalf("schedule through %s after the rotation: %v", id, err)
		}
		want[ev] = time.Now()
	}
	got.waitIDs(t, want, 15*time.Second)
}

func newGossipKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// writeGossipKeys replaces path with a key file of keys, as an operator
// would: a new file renamed over the old.
func writeGossipKeys(t *testing.T, path string, keys ...[]byte) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# written by the test\n")
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k) + "\n")
	}
	if err := os.WriteFile(path+".tmp", []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// keyInfo is how chime_gossip_key_info shows keys: "id role", sorted.
func keyInfo(keys ...[]byte) []string {
	var out []string
	for i, k := range keys {
		role := "secondary"
		if i == 0 {
			role = "primary"
		}
		out = append(out, membership.KeyID(k)+" "+role)
	}
	slices.Sort(out)
	return out
}

// gossipKeyMetrics reads d's chime_gossip_key_info (as keyInfo) and
// chime_gossip_key_file_errors_total from its /metrics.
func gossipKeyMetrics(t *testing.T, d *daemon) (keys []string, errors float64) {
	t.Helper()
	fams := scrape(t, d)
	for _, m := range fams["chime_gossip_key_info"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		keys = append(keys, labels["key"]+" "+labels["role"])
	}
	slices.Sort(keys)
	for _, m := range fams["chime_gossip_key_file_errors_total"].GetMetric() {
		errors += m.GetCounter().GetValue()
	}
	return keys, errors
}

// membersSince is node id's view of the members: each one's id and when it
// entered its state, alive members only (any other state fails the test).
func membersSince(t *testing.T, c *cluster, id string) map[string]time.Time {
	t.Helper()
	st := c.status(id)
	if st == nil {
		t.Fatalf("%s answers no status", id)
	}
	out := map[string]time.Time{}
	for _, m := range st.GetMembers() {
		if m.GetState() != "alive" {
			t.Fatalf("%s sees %s %s since %v", id, m.GetId(), m.GetState(), m.GetSince().AsTime())
		}
		out[m.GetId()] = m.GetSince().AsTime()
	}
	return out
}
