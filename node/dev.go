package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/chimehq/chime/node/console"
	"github.com/chimehq/chime/publish"
)

// StartBroker runs the embedded Kafka-protocol broker of chimed dev (kfake)
// on addr, one broker with auto-created topics of three partitions, keeping
// its data under dataDir/kafka so that records survive a restart. With sasl
// it demands that user of every client (chimed dev --kafka-sasl-*), so that
// dev tries the same connection a secured Kafka takes. It serves plaintext
// only. The caller closes it, after the nodes that produce to it.
func StartBroker(addr, dataDir string, sasl *publish.SASL) (*kfake.Cluster, error) {
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", portStr, err)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, addr) }),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(3),
		kfake.DataDir(filepath.Join(dataDir, "kafka")),
	}
	if sasl != nil {
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(sasl.Mechanism, sasl.User, sasl.Password))
	}
	return kfake.NewCluster(opts...)
}

// Dev is a running chimed dev: one node, not in cluster mode, producing to
// an embedded broker that StartDev started with it. Close stops both.
type Dev struct {
	*Node
	broker *kfake.Cluster
}

// DevShards is the shard count of a node StartDev starts, unless its edit
// sets another.
const DevShards = 2

// StartDev starts a chimed dev in dataDir, as `chimed dev` does with one
// node: the embedded broker (StartBroker) and a node producing to it, with
// chimed dev's defaults but for the addresses, which are all loopback with
// ports the kernel picks, and the shard count (DevShards), kept small so
// that it starts fast. edit, when not nil, changes the node's Config before
// it starts; Brokers is filled in after it. Its log is discarded unless
// edit sets a Logger.
//
// StartDev returns once every shard has a leader (WaitReady), or when ctx
// is done, with ctx's error and everything it started stopped again.
func StartDev(ctx context.Context, dataDir string, edit func(*Config)) (_ *Dev, err error) {
	cfg := Config{
		NodeID:      "dev",
		DataDir:     dataDir,
		GRPCAddr:    "127.0.0.1:0",
		HTTPAddr:    "127.0.0.1:0",
		RaftAddr:    "127.0.0.1:0",
		Shards:      DevShards,
		Replication: 1,
		MaxInFlight: publish.DefaultMaxInFlight,
		MaxAttempts: publish.DefaultMaxAttempts,
		DeadLetter:  publish.DefaultDeadLetterTopic,
		Logger:      slog.New(slog.DiscardHandler),
		Now:         time.Now,
		Console:     console.On,
	}
	if edit != nil {
		edit(&cfg)
	}
	broker, err := StartBroker("127.0.0.1:0", dataDir, cfg.KafkaSecurity.SASL)
	if err != nil {
		return nil, fmt.Errorf("node: embedded broker: %w", err)
	}
	defer func() {
		if err != nil {
			broker.Close()
		}
	}()
	cfg.Brokers = broker.ListenAddrs()
	n, err := Start(cfg)
	if err != nil {
		return nil, err
	}
	d := &Dev{Node: n, broker: broker}
	if err := n.WaitReady(ctx); err != nil {
		return nil, errors.Join(err, n.Close(context.Background()))
	}
	return d, nil
}

// Brokers returns the embedded broker's addresses, for consumers.
func (d *Dev) Brokers() []string { return d.broker.ListenAddrs() }

// Close stops the node gracefully (within ctx, as Node.Close does), then
// the broker.
func (d *Dev) Close(ctx context.Context) error {
	err := d.Node.Close(ctx)
	d.broker.Close()
	return err
}
