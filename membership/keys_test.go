package membership

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer collects a member's log while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testKey is a distinct key of n bytes.
func testKey(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }

var (
	key1 = testKey(32, 1)
	key2 = testKey(16, 2)
	key3 = testKey(24, 3)
)

func keyedConfig(id string, keys [][]byte, join ...string) Config {
	cfg := fastConfig(id, join...)
	cfg.Keys = keys
	return cfg
}

// refused starts cfg, which must fail to join, and returns the error.
func refused(t *testing.T, cfg Config) error {
	t.Helper()
	cfg.JoinTimeout = 500 * time.Millisecond
	m, err := Start(cfg)
	if err == nil {
		_ = m.Shutdown() // the Start should have failed; that it did not is the error
		t.Fatalf("%s with keys %v joined through %v", cfg.Meta.NodeID, keyIDs(cfg.Keys), cfg.Join)
	}
	return err
}

// onlyMembers is a waitView condition: the view holds exactly ids, all Alive.
func onlyMembers(ids ...string) func(View) string {
	return func(v View) string {
		if got := slices.Sorted(mapsKeys(v.Members)); !slices.Equal(got, ids) {
			return fmt.Sprintf("members %v, want %v", got, ids)
		}
		if live := v.Live(); !slices.Equal(live, ids) {
			return fmt.Sprintf("live %v, want %v", live, ids)
		}
		return ""
	}
}

// TestGossipKeyRequired: in a keyed cluster, a member with the key joins, and
// members without it (plaintext, another key, the key only as a secondary)
// are refused and never appear in anyone's view. A keyed member cannot join
// a plaintext cluster either.
func TestGossipKeyRequired(t *testing.T) {
	defer checkGoroutines(t)()
	a := start(t, keyedConfig("a", [][]byte{key1}))
	defer a.Shutdown()
	b := start(t, keyedConfig("b", [][]byte{key1, key2}, a.LocalAddr())) // key1 as primary, key2 spare
	defer b.Shutdown()
	for _, m := range []*Membership{a, b} {
		waitView(t, m, 10*time.Second, "converge", onlyMembers("a", "b"))
	}

	for _, tc := range []struct {
		id   string
		keys [][]byte
		want string // in the join error: what the joiner learned
	}{
		{"plain", nil, "encrypted and encryption is not configured"},
		{"other", [][]byte{key3}, "no installed keys could decrypt"},
		// a cannot read what it sends: key2 is its primary, a has only key1.
		{"secondary", [][]byte{key2, key1}, "remote error: no installed keys could decrypt"},
	} {
		err := refused(t, keyedConfig(tc.id, tc.keys, a.LocalAddr()))
		t.Logf("%s refused: %v", tc.id, err)
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: join error %q does not say %q", tc.id, err, tc.want)
		}
	}
	// Refused members never made it into a view (their probes and alive
	// messages were dropped too): a and b still see only each other.
	for _, m := range []*Membership{a, b} {
		if problem := onlyMembers("a", "b")(m.View()); problem != "" {
			t.Fatalf("%s after the refused joins: %s", m.View().Self, problem)
		}
	}

	// And the other way round: a keyed member cannot join a plaintext cluster.
	p := start(t, fastConfig("p"))
	defer p.Shutdown()
	err := refused(t, keyedConfig("k", [][]byte{key1}, p.LocalAddr()))
	t.Logf("keyed member refused by a plaintext cluster: %v", err)
	if !strings.Contains(err.Error(), "not encrypted") {
		t.Errorf("join error %q does not say the remote state is not encrypted", err)
	}
	if problem := onlyMembers("p")(p.View()); problem != "" {
		t.Fatalf("plaintext p: %s", problem)
	}
}

// TestGossipKeyRotation rotates key1 to key2 across three running members in
// the documented three steps, each applied on every member before the next,
// and checks after each step that the cluster still gossips (a metadata
// change reaches every member, nobody was ever declared dead). At the end a
// member with only the old key is refused and one with the new key joins;
// and, to show the checks can fail, a member that switches to a key the
// others do not have is cut off, and comes back when it has theirs again.
func TestGossipKeyRotation(t *testing.T) {
	defer checkGoroutines(t)()
	ids := []string{"a", "b", "c"}
	aLog := &syncBuffer{}
	var nodes []*Membership
	defer func() {
		for _, m := range nodes {
			_ = m.Shutdown() // the test's teardown, deferred
		}
	}()
	for i, id := range ids {
		var join []string
		if i > 0 {
			join = []string{nodes[0].LocalAddr()}
		}
		cfg := keyedConfig(id, [][]byte{key1}, join...)
		cfg.ReconnectInterval = 200 * time.Millisecond // for the cut-off member's return
		if id == "a" {
			cfg.Logger = slog.New(slog.NewTextHandler(aLog, nil))
		}
		nodes = append(nodes, start(t, cfg))
	}
	for _, m := range nodes {
		waitView(t, m, 10*time.Second, "converge", onlyMembers(ids...))
	}
	joined := map[string]time.Time{}
	for _, id := range ids {
		joined[id] = nodes[0].View().Members[id].Since
	}

	// gossips checks that the members still talk: a metadata change made on
	// one reaches every other (gossip or, failing that, push/pull, both
	// sealed with the sender's primary key), and no member was ever seen
	// leaving (Since would have moved).
	draining := false
	gossips := func(step string, from *Membership) {
		t.Helper()
		draining = !draining
		if err := from.SetDraining(draining); err != nil {
			t.Fatalf("%s: SetDraining: %v", step, err)
		}
		self := from.View().Self
		for _, m := range nodes {
			waitView(t, m, 10*time.Second, step+": see "+self+"'s drain flag", func(v View) string {
				if mem := v.Members[self]; mem.Meta.Draining != draining {
					return fmt.Sprintf("%s draining=%v", self, mem.Meta.Draining)
				}
				return onlyMembers(ids...)(v)
			})
		}
		for _, id := range ids {
			if since := nodes[0].View().Members[id].Since; !since.Equal(joined[id]) {
				t.Fatalf("%s: %s has been %s since %s: it was lost during the rotation", step, id, nodes[0].View().Members[id].State, since)
			}
		}
	}
	set := func(step string, keys [][]byte) {
		t.Helper()
		for i, m := range nodes {
			if err := m.SetKeys(keys); err != nil {
				t.Fatalf("%s: SetKeys on %s: %v", step, ids[i], err)
			}
			if got := m.Keys(); !slices.EqualFunc(got, keys, bytes.Equal) {
				t.Fatalf("%s: %s has keys %v, want %v", step, ids[i], keyIDs(got), keyIDs(keys))
			}
			// Both ways: the others read the member just changed, and it
			// reads them.
			gossips(step, m)
			gossips(step, nodes[(i+1)%len(nodes)])
		}
	}
	set("1 add key2", [][]byte{key1, key2})
	set("2 make key2 the primary", [][]byte{key2, key1})
	set("3 remove key1", [][]byte{key2})

	err := refused(t, keyedConfig("old", [][]byte{key1}, nodes[1].LocalAddr()))
	t.Logf("a member with only the old key: %v", err)
	for _, m := range nodes {
		if problem := onlyMembers(ids...)(m.View()); problem != "" {
			t.Fatalf("%s after the old-key join: %s", m.View().Self, problem)
		}
	}
	d := start(t, keyedConfig("d", [][]byte{key2}, nodes[1].LocalAddr()))
	defer d.Shutdown()
	for _, m := range append(slices.Clone(nodes), d) {
		waitView(t, m, 10*time.Second, "see d", onlyMembers("a", "b", "c", "d"))
	}

	// Out of order: a alone switches to key3. Nobody can read it any more,
	// until it has the cluster's key again.
	if err := nodes[0].SetKeys([][]byte{key3}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Membership{nodes[1], nodes[2], d} {
		waitView(t, m, 10*time.Second, "lose a", func(v View) string {
			if st := v.Members["a"].State; st != Dead {
				return "a is " + st.String()
			}
			return ""
		})
	}
	// a says why, as it tries to reach the others again.
	waitFor(t, 10*time.Second, "a, cut off, says that the keys do not match", func() string {
		if log := aLog.String(); !strings.Contains(log, "cannot reach members: the other side's gossip keys and this node's do not match") {
			return "its log:\n" + log
		}
		return ""
	})
	if err := nodes[0].SetKeys([][]byte{key2}); err != nil {
		t.Fatal(err)
	}
	for _, m := range append(slices.Clone(nodes), d) {
		waitView(t, m, 10*time.Second, "a back with the cluster's key", onlyMembers("a", "b", "c", "d"))
	}
}

func TestSetKeysChecks(t *testing.T) {
	defer checkGoroutines(t)()
	plain := start(t, fastConfig("plain"))
	defer plain.Shutdown()
	if err := plain.SetKeys([][]byte{key1}); !errors.Is(err, ErrNoEncryption) {
		t.Fatalf("SetKeys on a plaintext member: %v, want ErrNoEncryption", err)
	}
	if plain.Keys() != nil {
		t.Fatalf("plaintext member has keys %v", keyIDs(plain.Keys()))
	}

	m := start(t, keyedConfig("k", [][]byte{key1, key2}))
	defer m.Shutdown()
	for _, tc := range []struct {
		keys [][]byte
		want string
	}{
		{nil, "keys is empty"},
		{[][]byte{key1, testKey(20, 9)}, "keys[1] is 20 bytes: a key is 16, 24 or 32"},
		{[][]byte{key2, key1, key2}, "keys[2] is the same key as keys[0]"},
	} {
		err := m.SetKeys(tc.keys)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetKeys(%d keys) = %v, want an error with %q", len(tc.keys), err, tc.want)
		}
		if got := m.Keys(); !slices.EqualFunc(got, [][]byte{key1, key2}, bytes.Equal) {
			t.Fatalf("a refused SetKeys changed the keys to %v", keyIDs(got))
		}
	}
	// Any change goes through in one call: new keys added, primary set,
	// unlisted keys removed.
	for _, keys := range [][][]byte{{key3, key2}, {key1}, {key1, key2, key3}, {key3, key1, key2}} {
		if err := m.SetKeys(keys); err != nil {
			t.Fatal(err)
		}
		if got := m.Keys(); !slices.EqualFunc(got, keys, bytes.Equal) {
			t.Fatalf("after SetKeys(%v) the keys are %v", keyIDs(keys), keyIDs(got))
		}
	}

	cfg := keyedConfig("bad", [][]byte{testKey(8, 1)})
	if m, err := Start(cfg); err == nil {
		_ = m.Shutdown() // the Start should have failed; that it did not is the error
		t.Fatal("Start accepted an 8-byte key")
	} else if !strings.Contains(err.Error(), "Config.Keys[0] is 8 bytes") {
		t.Fatalf("Start with an 8-byte key: %v", err)
	}
}

func TestParseKeyFile(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString
	for _, tc := range []struct {
		name, file string
		want       [][]byte
		err        string
	}{
		{"one", b64(key1) + "\n", [][]byte{key1}, ""},
		{"no final newline", b64(key1), [][]byte{key1}, ""},
		{"comments blanks spaces CRLF", "# rotated 2026-11-24\r\n\r\n  " + b64(key2) + "  \r\n# old\n\t" + b64(key1) + "\n\n", [][]byte{key2, key1}, ""},
		{"three sizes", b64(key3) + "\n" + b64(key2) + "\n" + b64(key1), [][]byte{key3, key2, key1}, ""},
		{"empty", "", nil, "no key in it"},
		{"only comments", "# nothing yet\n\n", nil, "no key in it"},
		{"wrong length", b64(key1) + "\n" + b64(testKey(20, 7)) + "\n", nil, "line 2: 20 bytes after base64 decoding, a key is 16, 24 or 32"},
		{"not base64", "\n" + b64(key1) + "!\n", nil, "line 2: not a base64 key"},
		{"raw key", string(testKey(16, 'k')), nil, "line 1: 12 bytes after base64 decoding"},
		{"two on a line", b64(key1) + " " + b64(key2), nil, "line 1: not a base64 key"},
		{"duplicate", b64(key1) + "\n#\n" + b64(key1), nil, "line 3: the same key as line 1"},
	} {
		got, err := ParseKeyFile([]byte(tc.file))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.err)
		case !slices.EqualFunc(got, tc.want, bytes.Equal):
			t.Errorf("%s: keys %v, want %v", tc.name, keyIDs(got), keyIDs(tc.want))
		}
	}
}

// FuzzParseKeyFile: the parser never panics; what it accepts is a non-empty
// list of distinct valid keys that Config.Keys and SetKeys take, and
// writing them back one per line gives the same list.
func FuzzParseKeyFile(f *testing.F) {
	b64 := base64.StdEncoding.EncodeToString
	f.Add([]byte(b64(key1) + "\n"))
	f.Add([]byte("# primary\n" + b64(key2) + "\r\n\n" + b64(key1) + "\n# old\n"))
	f.Add([]byte(b64(testKey(20, 7))))
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := ParseKeyFile(data)
		if err != nil {
			if keys != nil {
				t.Fatalf("keys %v with error %v", keyIDs(keys), err)
			}
			if !strings.HasPrefix(err.Error(), "line ") && !strings.HasPrefix(err.Error(), "no key") {
				t.Fatalf("error %q names no line", err)
			}
			return
		}
		if err := checkKeys("keys", keys); err != nil {
			t.Fatalf("accepted keys that SetKeys refuses: %v", err)
		}
		var out []string
		for _, k := range keys {
			out = append(out, b64(k))
		}
		again, err := ParseKeyFile([]byte(strings.Join(out, "\n")))
		if err != nil || !slices.EqualFunc(again, keys, bytes.Equal) {
			t.Fatalf("round trip: %v, %v", keyIDs(again), err)
		}
	})
}
