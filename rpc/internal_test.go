package rpc

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/cluster"
	"github.com/chimehq/chime/membership"
)

func TestFormatHorizon(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{10 * 365 * day, "10y"},
		{10*365*day + 30*day, "10y30d"},
		{365*day + 12*time.Hour, "1y12h"},
		{90 * day, "90d"},
		{36 * time.Hour, "1d12h"},
		{2 * time.Hour, "2h"},
		{90 * time.Minute, "1h30m"},
		{10 * time.Minute, "10m"},
		{10 * time.Second, "10s"},
		{1500 * time.Millisecond, "1.5s"},
		{day + 500*time.Millisecond, "1d"},
		{0, "0s"},
	} {
		if got := formatHorizon(tc.d); got != tc.want {
			t.Errorf("formatHorizon(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestNewIDIs128BitsOfBase32(t *testing.T) {
	seen := make(map[string]bool)
	for range 1000 {
		id := newID()
		if len(id) != 26 {
			t.Fatalf("newID() = %q: %d characters, want 26", id, len(id))
		}
		if strings.Trim(id, "abcdefghijklmnopqrstuvwxyz234567") != "" {
			t.Fatalf("newID() = %q: not lower-case base32", id)
		}
		b, err := idEncoding.DecodeString(id)
		if err != nil || len(b) != 16 {
			t.Fatalf("newID() = %q decodes to %d bytes, %v; want 16", id, len(b), err)
		}
		if seen[id] {
			t.Fatalf("newID() returned %q twice", id)
		}
		seen[id] = true
	}
}

func TestLimitsValidateNamesTheFlag(t *testing.T) {
	if err := (Limits{}).Validate(); err != nil {
		t.Fatalf("zero Limits: %v", err)
	}
	err := Limits{MaxPayloadBytes: -1, MaxHorizon: -time.Second}.Validate()
	if err == nil {
		t.Fatal("negative limits accepted")
	}
	for _, want := range []string{"MaxPayloadBytes (--max-payload) must not be negative", "MaxHorizon (--max-horizon) must not be negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, want it to contain %q", err, want)
		}
	}
	if err := (Limits{MaxPayloadBytes: MaxPayloadLimit}).Validate(); err != nil {
		t.Errorf("a payload limit of 16 MiB: %v", err)
	}
	if err := (Limits{MaxPayloadBytes: MaxPayloadLimit + 1}).Validate(); err == nil || !strings.Contains(err.Error(), "MaxPayloadBytes (--max-payload) must be at most 16777216") {
		t.Errorf("a payload limit above 16 MiB: %v", err)
	}
	if n := (Limits{MaxPayloadBytes: MaxPayloadLimit}).MaxRequestBytes(); n >= 64<<20 {
		t.Errorf("the largest request under the largest payload limit is %d bytes, beyond what one Raft log entry holds", n)
	}
	if got := (Limits{MaxKeyBytes: 5}).withDefaults(); got.MaxKeyBytes != 5 || got.MaxPayloadBytes != 1<<20 || got.MaxHorizon != 10*year {
		t.Errorf("withDefaults() = %+v", got)
	}
}

// A leader that gossip does not know (a replica still names a node that was
// just removed) is leadership on the move: UNAVAILABLE, which callers such
// as a backup retry; a node the user named and nobody knows is NOT_FOUND.
func TestLeaderNobodyKnowsIsUnavailable(t *testing.T) {
	c, err := cluster.New(cluster.Config{Self: membership.Meta{NodeID: "n1"}, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	a := &Admin{c: c}
	_, err = a.leaderClient(2, "n9")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shard 2: its leader n9 is not a known member") {
		t.Errorf("leaderClient: %v, want UNAVAILABLE naming the shard and the leader", err)
	}
	if _, err := a.adminClient("n9"); status.Code(err) != codes.NotFound {
		t.Errorf("adminClient: %v, want NOT_FOUND", err)
	}
}
