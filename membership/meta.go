package membership

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/memberlist"
)

// Meta is what a node tells the others about itself. It travels as
// memberlist node metadata, so its encoding must stay within
// memberlist.MetaMaxSize (512 bytes); Start and SetDraining check it.
type Meta struct {
	// NodeID names the node for its whole life. It is also memberlist's
	// node name, so two live nodes cannot share it.
	NodeID   string `json:"id"`
	GRPCAddr string `json:"grpc,omitempty"`
	RaftAddr string `json:"raft,omitempty"`
	HTTPAddr string `json:"http,omitempty"`

	// Draining asks the shard leaders to move this node's replicas away.
	// A draining node stays live; it is only no longer a placement candidate.
	Draining bool `json:"drain,omitempty"`

	// Cluster parameters, fixed when the cluster was created, so a new node
	// learns them (View.ClusterParams) and a node with different stored ones
	// can refuse to start. Zero while a new node has not learned them yet.
	ClusterID   string `json:"cluster,omitempty"`
	Shards      uint32 `json:"shards,omitempty"`
	Replication uint32 `json:"r,omitempty"`
	// Retention is how long settled events are kept; zero keeps them
	// forever (and is what a cluster created before retention existed has).
	Retention time.Duration `json:"ret,omitempty"`
}

// ClusterParams are the parameters a cluster is created with and keeps.
type ClusterParams struct {
	ClusterID   string
	Shards      uint32
	Replication uint32
	Retention   time.Duration
}

// IsZero reports whether no parameter is set (a node that has not learned them).
func (p ClusterParams) IsZero() bool { return p == ClusterParams{} }

func (p ClusterParams) String() string {
	ret := "kept forever"
	if p.Retention > 0 {
		ret = p.Retention.String()
	}
	return fmt.Sprintf("cluster %q (%d shards, replication %d, retention %s)", p.ClusterID, p.Shards, p.Replication, ret)
}

// ClusterParams returns the cluster parameters m advertises.
func (m Meta) ClusterParams() ClusterParams {
	return ClusterParams{ClusterID: m.ClusterID, Shards: m.Shards, Replication: m.Replication, Retention: m.Retention}
}

// MaxShards bounds a cluster's shard count: shard ids are below 1<<31, since
// the node's Raft port gives the ids with the top bit set to the shards'
// install layers (shard.InstallLayerID).
const MaxShards = 1 << 31

// ErrMetaTooLarge is returned when a node's encoded metadata would not fit in
// memberlist's node metadata (memberlist.MetaMaxSize bytes).
var ErrMetaTooLarge = errors.New("membership: node metadata too large")

// encodeMeta encodes m as gossiped. The size check is done with Draining
// set, so a meta accepted once can never grow past the limit through
// SetDraining.
func encodeMeta(m Meta) ([]byte, error) {
	if m.NodeID == "" {
		return nil, errors.New("membership: Meta.NodeID is empty: every node needs a stable id")
	}
	if err := m.ClusterParams().check(); err != nil {
		return nil, err // the other nodes would refuse the metadata
	}
	worst := m
	worst.Draining = true
	b, err := json.Marshal(worst)
	if err != nil {
		return nil, fmt.Errorf("membership: encode meta: %w", err)
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes encoded (with the draining flag), limit %d: shorten NodeID (%d bytes), ClusterID (%d) or the addresses (%d, %d, %d)",
			ErrMetaTooLarge, len(b), memberlist.MetaMaxSize,
			len(m.NodeID), len(m.ClusterID), len(m.GRPCAddr), len(m.RaftAddr), len(m.HTTPAddr))
	}
	return json.Marshal(m)
}

// decodeMeta decodes metadata as gossiped. Metadata that advertises cluster
// parameters no cluster can have is refused like bytes that do not decode: a
// node that joins learns the parameters, stores them in its cluster.json and
// sizes its shards by them.
func decodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) == 0 {
		return m, errors.New("no metadata")
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, err
	}
	if err := m.ClusterParams().check(); err != nil {
		return Meta{}, err
	}
	return m, nil
}

// check refuses parameters no cluster is created with; none at all (a node
// that has not learned them) pass.
func (p ClusterParams) check() error {
	switch {
	case p.IsZero():
	case p.Shards < 1 || p.Shards > MaxShards:
		return fmt.Errorf("membership: %s: the shard count must be 1 to %d", p, MaxShards)
	case p.Retention < 0:
		return fmt.Errorf("membership: %s: negative retention", p)
	}
	return nil
}
