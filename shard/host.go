package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
)

// HostConfig configures the shard replicas of one node.
type HostConfig struct {
	NodeID  string
	DataDir string // each shard's Raft state goes in DataDir/shard-NNNN
	Shards  int    // the cluster's shard count, fixed at creation
	// RaftListener carries every shard's Raft traffic; RaftAdvertise is the
	// address peers dial (default: the listener's address).
	RaftListener  net.Listener
	RaftAdvertise string
	Store         *raftfsm.Store
	Publisher     *publish.Publisher
	Tuning        Tuning
	Now           func() time.Time
	Logger        *slog.Logger
	Metrics       *Metrics
}

// Host owns the shard replicas of one node and the Raft port they share, and
// routes each event id to its shard.
type Host struct {
	cfg    HostConfig
	mux    *Mux
	shards map[uint32]*Shard
}

// OpenHost opens every shard replica of this node. A shard with no Raft
// state yet is bootstrapped with this node as its only voter.
func OpenHost(cfg HostConfig) (*Host, error) {
	if cfg.Shards <= 0 {
		return nil, fmt.Errorf("shard count must be positive, got %d", cfg.Shards)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RaftAdvertise == "" {
		cfg.RaftAdvertise = cfg.RaftListener.Addr().String()
	}
	h := &Host{cfg: cfg, mux: NewMux(cfg.RaftListener, cfg.Logger), shards: make(map[uint32]*Shard)}
	self := []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(cfg.NodeID), Address: raft.ServerAddress(cfg.RaftAdvertise)}}
	for i := range cfg.Shards {
		id := uint32(i)
		layer, err := h.mux.Layer(id)
		if err != nil {
			h.Close()
			return nil, err
		}
		s, err := Open(Config{
			ID: id, NodeID: cfg.NodeID, Dir: filepath.Join(cfg.DataDir, fmt.Sprintf("shard-%04d", id)),
			Store: cfg.Store, Layer: layer, Publisher: cfg.Publisher, Bootstrap: self,
			Tuning: cfg.Tuning, Now: cfg.Now, Logger: cfg.Logger, Metrics: cfg.Metrics,
		})
		if err != nil {
			layer.Close()
			h.Close()
			return nil, err
		}
		h.shards[id] = s
	}
	return h, nil
}

// Close stops every shard replica, then the Raft port.
func (h *Host) Close() error {
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range h.shards {
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
	if err := h.mux.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Shards returns the replicas on this node, by shard id.
func (h *Host) Shards() map[uint32]*Shard { return h.shards }

func (h *Host) shardFor(id string) (*Shard, error) {
	s := h.shards[For(id, h.cfg.Shards)]
	if s == nil {
		return nil, ErrUnknownShard
	}
	return s, nil
}

// Ready reports whether every shard has a leader.
func (h *Host) Ready() bool {
	for _, s := range h.shards {
		if addr, _ := s.raft.LeaderWithID(); addr == "" {
			return false
		}
	}
	return true
}

// Schedule routes each request to its shard, proposes them there (shards in
// parallel) and returns the results in request order. Any shard's error
// fails the call; requests that did commit are then found idempotently on a
// retry with the same ids.
func (h *Host) Schedule(ctx context.Context, reqs []Request) ([]Result, error) {
	if len(reqs) == 1 {
		s, err := h.shardFor(reqs[0].ID)
		if err != nil {
			return nil, err
		}
		return s.Schedule(ctx, reqs)
	}
	type group struct {
		idx  []int
		reqs []Request
	}
	groups := make(map[uint32]*group)
	for i, r := range reqs {
		id := For(r.ID, h.cfg.Shards)
		g := groups[id]
		if g == nil {
			g = &group{}
			groups[id] = g
		}
		g.idx = append(g.idx, i)
		g.reqs = append(g.reqs, r)
	}
	out := make([]Result, len(reqs))
	errs := make(chan error, len(groups))
	for id, g := range groups {
		go func() {
			s := h.shards[id]
			if s == nil {
				errs <- ErrUnknownShard
				return
			}
			res, err := s.Schedule(ctx, g.reqs)
			if err == nil {
				for j, r := range res {
					out[g.idx[j]] = r
				}
			}
			errs <- err
		}()
	}
	var first error
	for range groups {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

// Cancel cancels id on its shard.
func (h *Host) Cancel(ctx context.Context, id string) (raftfsm.CancelResult, error) {
	s, err := h.shardFor(id)
	if err != nil {
		return raftfsm.CancelResult{}, err
	}
	return s.Cancel(ctx, id)
}

// Get reads id on its shard.
func (h *Host) Get(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	s, err := h.shardFor(id)
	if err != nil {
		return raftfsm.Record{}, false, err
	}
	return s.Get(ctx, id)
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
)

func (c hostCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPending, descEvents, descRefired, descApplied, descLeader} {
		ch <- d
	}
}

func (c hostCollector) Collect(ch chan<- prometheus.Metric) {
	for id, s := range c.h.shards {
		shard := fmt.Sprint(id)
		st := s.Stats()
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(st.Pending), shard)
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.GaugeValue, float64(st.Fired), shard, "fired")
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.GaugeValue, float64(st.Cancelled), shard, "cancelled")
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.GaugeValue, float64(st.DeadLettered), shard, "dead_lettered")
		ch <- prometheus.MustNewConstMetric(descRefired, prometheus.CounterValue, float64(st.Refired), shard)
		ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(st.AppliedIndex), shard)
		leader := 0.0
		if s.IsLeader() {
			leader = 1
		}
		ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader, shard)
	}
}
