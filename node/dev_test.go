package node

import (
	"context"
	"testing"
	"time"
)

// StartDev returns a ready node and its broker; one whose context ends
// before the node is ready stops everything it started, so the same data
// directory starts again.
func TestStartDev(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node; skipped with -short")
	}
	dir := t.TempDir()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if d, err := StartDev(cancelled, dir, nil); err == nil {
		// The same data directory starts again below.
		if err := d.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Log("the node was ready before its first look at the context")
	} else {
		t.Logf("cancelled: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := StartDev(ctx, dir, func(c *Config) { c.Shards = 1 })
	if err != nil {
		t.Fatal(err)
	}
	if cfg := d.Config(); cfg.Shards != DevShards || cfg.Cluster || len(d.Brokers()) != 1 || cfg.Brokers[0] != d.Brokers()[0] {
		t.Errorf("config %+v, brokers %v; want the directory's %d shards, one node, the embedded broker", cfg, d.Brokers(), DevShards)
	}
	if !d.Host().Ready() {
		t.Error("StartDev returned before the shards had leaders")
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
