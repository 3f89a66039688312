package host

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/raftmux"
	"github.com/chimehq/chime/shard/topiclimit"
	"golang.org/x/time/rate"
)

// Config configures the shard replicas of one node.
type Config struct {
	NodeID  string
	DataDir string // each shard's Raft state goes in DataDir/shard-NNNN
	Shards  int    // the cluster's shard count, fixed at creation
	// RaftListener carries every shard's Raft traffic; RaftAdvertise is the
	// address peers dial (default: the listener's address).
	RaftListener  net.Listener
	RaftAdvertise string
	// RaftTLS, if set, makes the Raft port mutual TLS (see raftmux.TLS).
	RaftTLS *raftmux.TLS
	// Transport, when set, gives each shard its own Raft transport instead
	// of a stream layer of the Raft port, and RaftListener must be nil
	// (tests pass raft's in-memory transports). RaftAdvertise is required
	// with it.
	Transport func(shard uint32) (raft.Transport, error)
	Store     *raftfsm.Store
	Publisher *publish.Publisher
	// DiskFailed is every replica's shard.Config.DiskFailed.
	DiskFailed func(error)
	// Bootstrap creates every shard that has no Raft state yet with this
	// node as its only voter: the first node of a new cluster, or a single
	// node. Other nodes start empty and receive replicas from the leaders.
	Bootstrap bool
	// Directory is the cluster as the shards see it. Nil means a fixed
	// single-node host: no placement, no reconciliation.
	Directory shard.Directory
	// TopicLimits are the node's per-topic fire rate limits, of which each
	// shard's leader enforces a share (nil: none).
	TopicLimits *topiclimit.Table
	Tuning      shard.Tuning
	Now         func() time.Time
	Logger      *slog.Logger
	Metrics     *shard.Metrics
}

// Host owns the shard replicas of one node and the Raft port they share,
// routes each event id to its shard, and (with a Directory) opens and
// releases replicas as the placement moves them.
type Host struct {
	cfg Config
	mux *raftmux.Mux
	// installs paces the full snapshots every replica of this node sends,
	// together (shard.Config.Installs).
	installs *rate.Limiter

	mu     sync.RWMutex
	shards map[uint32]*shard.Shard

	stop chan struct{}
	done chan struct{}
}

// Open opens the shard replicas this node holds: every shard with Raft
// state in DataDir, plus, with Bootstrap, every shard of the cluster.
func Open(cfg Config) (*Host, error) {
	if cfg.Shards <= 0 {
		return nil, fmt.Errorf("shard count must be positive, got %d", cfg.Shards)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Host{cfg: cfg, shards: make(map[uint32]*shard.Shard), stop: make(chan struct{}), done: make(chan struct{}),
		installs: shard.NewInstallLimiter(cfg.Tuning)}
	switch {
	case (cfg.Transport == nil) == (cfg.RaftListener == nil):
		return nil, errors.New("host: exactly one of Config.RaftListener and Config.Transport must be set")
	case cfg.Transport != nil && cfg.RaftAdvertise == "":
		return nil, errors.New("host: Config.RaftAdvertise is required with Config.Transport")
	case cfg.Transport == nil:
		if cfg.RaftAdvertise == "" {
			h.cfg.RaftAdvertise = cfg.RaftListener.Addr().String()
		}
		h.mux = raftmux.New(cfg.RaftListener, cfg.RaftTLS, cfg.Logger)
	}
	if err := shard.FinishReleases(cfg.Store, cfg.Shards, h.shardDir); err != nil {
		close(h.done)
		_ = h.Close() // nothing is open yet but the mux; err is what failed
		return nil, err
	}
	// Replicas open in parallel: each rebuilds its wheel from Pebble and
	// waits out an election timeout, and one after another they made a
	// node with 10M pending events take 12 s to restart.
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	for i := range cfg.Shards {
		id := uint32(i)
		_, err := os.Stat(h.shardDir(id))
		if err != nil && !cfg.Bootstrap {
			continue
		}
		wg.Go(func() {
			if _, err := h.openReplica(id, cfg.Bootstrap); err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		close(h.done)
		// Releases the replicas that did open; firstErr is what failed.
		_ = h.Close()
		return nil, firstErr
	}
	if cfg.Directory == nil {
		close(h.done)
	} else {
		go h.controlLoop()
	}
	return h, nil
}

func (h *Host) shardDir(id uint32) string { return ReplicaDir(h.cfg.DataDir, id) }

// ReplicaDir is the Raft directory of this node's replica of shard id, under
// the host's Config.DataDir. A restore (chimed restore) plants a replica's
// Raft snapshot there before the host first opens; Open opens every replica
// whose directory exists.
func ReplicaDir(dataDir string, id uint32) string {
	return filepath.Join(dataDir, fmt.Sprintf("shard-%04d", id))
}

// openReplica opens this node's replica of shard id. With bootstrap, a shard
// with no Raft state starts with this node as its only voter; without, it
// waits for the shard's leader to add it.
func (h *Host) openReplica(id uint32, bootstrap bool) (*shard.Shard, error) {
	var (
		layer, installs raft.StreamLayer
		transport       raft.Transport
		err             error
	)
	if h.cfg.Transport != nil {
		transport, err = h.cfg.Transport(id)
	} else if layer, err = h.mux.Layer(id); err == nil {
		if installs, err = h.mux.Layer(shard.InstallLayerID(id)); err != nil {
			_ = layer.Close()
		}
	}
	if err != nil {
		return nil, err
	}
	var voters []raft.Server
	if bootstrap {
		voters = []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(h.cfg.NodeID), Address: raft.ServerAddress(h.cfg.RaftAdvertise)}}
	}
	cfg := h.cfg
	s, err := shard.Open(shard.Config{
		ID: id, NodeID: cfg.NodeID, Dir: h.shardDir(id),
		Store: cfg.Store, Layer: layer, InstallLayer: installs, Transport: transport, Publisher: cfg.Publisher, Bootstrap: voters,
		Directory: cfg.Directory, Installs: h.installs, Tuning: cfg.Tuning, Now: cfg.Now, Logger: cfg.Logger, Metrics: cfg.Metrics,
		TopicLimits: cfg.TopicLimits, Shares: cfg.Shards, DiskFailed: cfg.DiskFailed,
	})
	if err != nil {
		if layer != nil {
			_ = layer.Close()
			_ = installs.Close()
		} else if c, ok := transport.(interface{ Close() error }); ok {
			_ = c.Close()
		}
		return nil, err
	}
	h.mu.Lock()
	h.shards[id] = s
	h.mu.Unlock()
	return s, nil
}

// closeReplica takes this node's replica of shard id out of the host and
// closes it; it reports whether there was one. why names the reason in the
// log if the close fails.
func (h *Host) closeReplica(id uint32, why string) bool {
	h.mu.Lock()
	s := h.shards[id]
	delete(h.shards, id)
	h.mu.Unlock()
	if s == nil {
		return false
	}
	if err := s.Close(); err != nil {
		h.cfg.Logger.Warn("closing a replica", "shard", id, "why", why, "err", err)
	}
	return true
}

// reopenReplica closes this node's replica of shard id and opens it again
// from its data, with a new raft instance: the cure for a replica whose raft
// is wedged (shard.Shard.Stuck).
func (h *Host) reopenReplica(id uint32) error {
	if !h.closeReplica(id, "reopening") {
		return nil
	}
	_, err := h.openReplica(id, false)
	return err
}

// releaseReplica closes this node's replica of shard id and deletes its data
// (crash-atomically: shard.ReleaseData): the shard's leader has taken it out
// of the configuration.
func (h *Host) releaseReplica(id uint32) error {
	if !h.closeReplica(id, "released") {
		return nil
	}
	return shard.ReleaseData(h.cfg.Store, id, h.shardDir(id))
}

// Close stops every shard replica, then the Raft port.
func (h *Host) Close() error {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	<-h.done
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	h.mu.Lock()
	shards := h.shards
	h.shards = map[uint32]*shard.Shard{}
	h.mu.Unlock()
	for _, s := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Close(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("shard %d: %w", s.ID(), err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if h.mux != nil {
		if err := h.mux.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// NodeID returns this node's id.
func (h *Host) NodeID() string { return h.cfg.NodeID }

// Shards returns the replicas on this node, by shard id.
func (h *Host) Shards() map[uint32]*shard.Shard {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return maps.Clone(h.shards)
}

// Replica returns this node's replica of shard id, or nil.
func (h *Host) Replica(id uint32) *shard.Shard {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.shards[id]
}

// Ready reports whether every replica on this node knows a leader (and, for a
// fixed single-node host, that every shard has one).
func (h *Host) Ready() bool {
	shards := h.Shards()
	if h.cfg.Directory == nil && len(shards) < h.cfg.Shards {
		return false
	}
	for _, s := range shards {
		if s.Leader() == "" {
			return false
		}
	}
	return true
}

// MissingVoters returns the shards the placement gives this node that do
// not yet count it among their voters: a node that has just started or
// joined is added to each as a non-voter, catches up, and is promoted.
// Until that is done for every one, stopping another replica of such a
// shard can cost it its quorum, so a rolling restart waits for none to be
// missing before it stops the next node. Nil without a Directory.
func (h *Host) MissingVoters() []uint32 {
	dir := h.cfg.Directory
	if dir == nil {
		return nil
	}
	var missing []uint32
	for id := range uint32(h.cfg.Shards) {
		if !slices.Contains(dir.Desired(id), h.cfg.NodeID) {
			continue
		}
		s := h.Replica(id)
		if s == nil {
			missing = append(missing, id)
			continue
		}
		if voters, _, err := s.Configuration(); err != nil || !slices.Contains(voters, h.cfg.NodeID) {
			missing = append(missing, id)
		}
	}
	return missing
}

// Collector exposes per-shard state to Prometheus, read on each scrape.
func (h *Host) Collector() prometheus.Collector { return hostCollector{h} }

type hostCollector struct{ h *Host }

var (
	descPending = prometheus.NewDesc("chime_shard_pending_events", "Events scheduled and not yet fired, cancelled or dead-lettered.", []string{"shard"}, nil)
	descEvents  = prometheus.NewDesc("chime_shard_events", "Events by final state, as replicated in the shard.", []string{"shard", "state"}, nil)
	descRefired = prometheus.NewDesc("chime_shard_refired_total", "MarkFired entries for events already fired: duplicate deliveries around leader changes.", []string{"shard"}, nil)
	descApplied = prometheus.NewDesc("chime_shard_applied_index", "Last Raft log index applied to Pebble.", []string{"shard"}, nil)
	descLeader  = prometheus.NewDesc("chime_shard_is_leader", "1 when this node leads the shard.", []string{"shard"}, nil)
	descVoters  = prometheus.NewDesc("chime_shard_voters", "Voters in the shard's Raft configuration, reported by the shard's leader only (fewer than the replication factor while a replica is missing).", []string{"shard"}, nil)

	descRetained   = prometheus.NewDesc("chime_shard_settled_retained_events", "Settled (fired, cancelled, dead-lettered) events still stored: their ids stay idempotency keys until the retention removes them.", []string{"shard"}, nil)
	descExpired    = prometheus.NewDesc("chime_shard_expired_total", "Settled events removed after the retention.", []string{"shard"}, nil)
	descReclaimed  = prometheus.NewDesc("chime_shard_reclaimed_bytes_total", "Bytes of keys and values the retention clean-up deleted on this replica since it opened (Pebble frees the disk space as it compacts).", []string{"shard"}, nil)
	descCleanupLag = prometheus.NewDesc("chime_shard_cleanup_lag_seconds", "How long ago the oldest settled event still stored should have been removed; 0 when the clean-up keeps up.", []string{"shard"}, nil)

	descInstallsSent = prometheus.NewDesc("chime_shard_installs_sent_total", "Copies of the shard this replica has sent to followers too far behind for its log (a new replica takes one; a send that was cut and resumed counts twice).", []string{"shard"}, nil)
	descInstallBytes = prometheus.NewDesc("chime_shard_install_bytes_sent_total", "Bytes of those copies sent (a cut send resumes where it was cut).", []string{"shard"}, nil)

	descWheelEvents  = prometheus.NewDesc("chime_shard_wheel_events", "Events held in memory by the timing wheel: those due within the wheel horizon (and retries).", []string{"shard"}, nil)
	descWheelHorizon = prometheus.NewDesc("chime_shard_wheel_horizon_seconds", "How far ahead of now the wheel holds every pending event; below --wheel-horizon only while loading the next events from disk lags.", []string{"shard"}, nil)
)

func (c hostCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPending, descEvents, descRefired, descApplied, descLeader, descVoters,
		descRetained, descExpired, descReclaimed, descCleanupLag, descWheelEvents, descWheelHorizon, descInstallsSent, descInstallBytes} {
		ch <- d
	}
}

func (c hostCollector) Collect(ch chan<- prometheus.Metric) {
	for id, s := range c.h.Shards() {
		shard := fmt.Sprint(id)
		st := s.Stats()
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(st.Pending), shard)
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.GaugeValue, float64(st.Fired), shard, "fired")
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.GaugeValue, float64(st.Cancelled), shard, "cancelled")
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.GaugeValue, float64(st.DeadLettered), shard, "dead_lettered")
		ch <- prometheus.MustNewConstMetric(descRefired, prometheus.CounterValue, float64(st.Refired), shard)
		ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(st.AppliedIndex), shard)
		ch <- prometheus.MustNewConstMetric(descRetained, prometheus.GaugeValue, float64(st.Retained), shard)
		ch <- prometheus.MustNewConstMetric(descExpired, prometheus.CounterValue, float64(st.Expired), shard)
		ch <- prometheus.MustNewConstMetric(descReclaimed, prometheus.CounterValue, float64(s.ReclaimedBytes()), shard)
		ch <- prometheus.MustNewConstMetric(descCleanupLag, prometheus.GaugeValue, s.CleanupLag().Seconds(), shard)
		inWheel, ahead := s.WheelEvents()
		ch <- prometheus.MustNewConstMetric(descWheelEvents, prometheus.GaugeValue, float64(inWheel), shard)
		ch <- prometheus.MustNewConstMetric(descWheelHorizon, prometheus.GaugeValue, ahead.Seconds(), shard)
		ch <- prometheus.MustNewConstMetric(descInstallsSent, prometheus.CounterValue, float64(s.InstallsSent()), shard)
		ch <- prometheus.MustNewConstMetric(descInstallBytes, prometheus.CounterValue, float64(s.InstallBytesSent()), shard)
		leader := 0.0
		if s.IsLeader() {
			leader = 1
			// Only the leader's configuration is the one in force; a
			// follower's may lag a change behind.
			if voters, _, err := s.Configuration(); err == nil {
				ch <- prometheus.MustNewConstMetric(descVoters, prometheus.GaugeValue, float64(len(voters)), shard)
			}
		}
		ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader, shard)
	}
}
