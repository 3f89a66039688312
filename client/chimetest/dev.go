package chimetest

import (
	"context"
	"testing"
	"time"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/node"
)

// StartDev starts a chimed dev node inside the test process, as
// `chimed dev` does: a real node (Pebble, Raft, the timing wheel, the
// publisher) with its data in t.TempDir(), producing to an embedded
// Kafka-protocol broker, every port on loopback. It returns once the node
// is ready, with a client connected to it and the broker's address, from
// which a test consumes the records the node fires (with franz-go or
// kafka-go; topics are created on first use). The test's cleanup closes
// the client, then stops the node and the broker.
//
// It takes a few seconds; prefer NewFake where a real node is not the
// point.
func StartDev(t testing.TB) (*client.Client, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := node.StartDev(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("chimetest: StartDev: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil {
			t.Errorf("chimetest: StartDev: stopping the node: %v", err)
		}
	})
	c, err := client.Dial(ctx, d.GRPCAddr())
	if err != nil {
		t.Fatalf("chimetest: StartDev: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("chimetest: StartDev: closing the client: %v", err)
		}
	})
	return c, d.Brokers()[0]
}
