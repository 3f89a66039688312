package node

import (
	"bytes"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/chimehq/chime/membership"
)

// TestKeyWatcherAppliesChangesAndKeepsKeysOnBadFiles drives the watcher's
// check directly (the ticker only calls it): a changed file is applied, a
// file that does not load leaves the keys in use and is logged and counted
// once per change, and a fixed file is applied again.
func TestKeyWatcherAppliesChangesAndKeepsKeysOnBadFiles(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 16)
	b64 := base64.StdEncoding.EncodeToString
	path := filepath.Join(t.TempDir(), "gossip.keys")
	write := func(content string) {
		t.Helper()
		// A new file renamed over the old, as operators are told to.
		if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("# the cluster's key\n" + b64(k1) + "\n")
	keys, stamp, err := readKeyFile(path)
	if err != nil || !slices.EqualFunc(keys, [][]byte{k1}, bytes.Equal) {
		t.Fatalf("readKeyFile: %d keys, %v", len(keys), err)
	}
	logs := &bytes.Buffer{} // written only by check, before the goroutine starts
	logger := slog.New(slog.NewTextHandler(logs, nil))
	ml, err := membership.Start(membership.Config{
		Meta: membership.Meta{NodeID: "a"}, BindAddr: "127.0.0.1:0", Keys: keys, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ml.Shutdown()
	w := newKeyWatcher(path, stamp, ml, logger)
	reg := prometheus.NewRegistry()
	reg.MustRegister(keysCollector{ml: ml, watcher: w})

	has := func(step string, want ...[]byte) {
		t.Helper()
		if got := ml.Keys(); !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("%s: keys in use %v, want %v", step, ids(got), ids(want))
		}
		var wantInfo, gotInfo []string
		for i, k := range want {
			role := "secondary"
			if i == 0 {
				role = "primary"
			}
			wantInfo = append(wantInfo, membership.KeyID(k)+" "+role)
		}
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "chime_gossip_key_info" {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				gotInfo = append(gotInfo, labels["key"]+" "+labels["role"])
			}
		}
		slices.Sort(wantInfo)
		if !slices.Equal(gotInfo, wantInfo) {
			t.Fatalf("%s: chime_gossip_key_info %v, want %v", step, gotInfo, wantInfo)
		}
	}
	errorsCounted := func() int { return int(testutil.ToFloat64(w.errors)) }

	w.check() // unchanged: nothing to do
	has("unchanged", k1)

	write(b64(k1) + "\n" + b64(k2) + "\n")
	w.check()
	has("k2 added", k1, k2)

	write(b64(k2) + "\n" + b64(bytes.Repeat([]byte{3}, 20)) + "\n")
	w.check()
	w.check() // the same bad file again: not logged or counted twice
	has("bad file", k1, k2)
	if n := errorsCounted(); n != 1 {
		t.Fatalf("a bad file counted %d times, want 1", n)
	}
	if out := logs.String(); strings.Count(out, "cannot be applied") != 1 || !strings.Contains(out, path+": line 2: 20 bytes after base64 decoding") {
		t.Fatalf("log of a bad file:\n%s", out)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	w.check()
	w.check()
	has("file gone", k1, k2)
	if n := errorsCounted(); n != 2 {
		t.Fatalf("errors counted %d after the file went, want 2", n)
	}

	write(b64(k2) + "\n" + b64(k1) + "\n")
	w.check()
	has("k2 primary", k2, k1)
	write("# rotated\n" + b64(k2) + "\n")
	w.check()
	has("k1 removed", k2)

	// The goroutine: started, it applies a change within a poll or two, and
	// Close ends it. The membership tells no one when its keys change, so
	// the test looks at them on a ticker until a deadline.
	w.start()
	write(b64(k1) + "\n" + b64(k2) + "\n")
	look := time.NewTicker(20 * time.Millisecond)
	defer look.Stop()
	deadline := time.After(5 * gossipKeyPoll)
	for !slices.EqualFunc(ml.Keys(), [][]byte{k1, k2}, bytes.Equal) {
		select {
		case <-deadline:
			t.Fatalf("the running watcher did not apply the file within %s: keys in use %v", 5*gossipKeyPoll, ids(ml.Keys()))
		case <-look.C:
		}
	}
	w.Close()
}

func ids(keys [][]byte) []string {
	var out []string
	for _, k := range keys {
		out = append(out, membership.KeyID(k))
	}
	return out
}
