package membership

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// State is what this node believes about another node's liveness.
type State int

const (
	// Alive: the node answers probes (or refuted a suspicion).
	Alive State = iota
	// Suspect: a probe failed and the node has not refuted yet. Memberlist
	// v0.5.4 gives no callback for suspicion and does not expose a node's
	// state, so Membership never reports it: a suspected node stays Alive
	// until it is declared Dead. The value exists so placement code treats it
	// right if a later memberlist makes it visible.
	Suspect
	// Dead: the failure detector declared the node failed.
	Dead
	// Left: the node announced a graceful leave.
	Left
)

func (s State) String() string {
	switch s {
	case Alive:
		return "alive"
	case Suspect:
		return "suspect"
	case Dead:
		return "dead"
	case Left:
		return "left"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// MarshalText makes a State readable in JSON and logs.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Live reports whether s counts as a live node (Alive or Suspect).
func (s State) Live() bool { return s == Alive || s == Suspect }

// Member is one node as this node sees it.
type Member struct {
	Meta  Meta
	State State
	// Since is when the node entered State, by this node's clock
	// (Config.Now). Two nodes disagree on it by their detection delay.
	Since      time.Time
	GossipAddr string
}

// View is a snapshot of the membership as one node sees it. It is a value:
// nothing changes it after View returns it.
type View struct {
	// Self is the id of the node that took the snapshot.
	Self string
	// Members by node id, including Self, and dead or left nodes this node
	// still remembers (it remembers them until it stops).
	Members map[string]Member
}

// Live returns the ids of the members that are Alive or Suspect, sorted.
// Draining members are live.
func (v View) Live() []string {
	ids := make([]string, 0, len(v.Members))
	for id, m := range v.Members {
		if m.State.Live() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Candidates returns the ids of the nodes shards may be placed on, sorted:
// members that are Alive or Suspect, or Dead or Left for less than
// deadTimeout (a node that comes back in time keeps its replicas; one gone
// longer is replaced). A member is never a candidate while it is Draining, is
// in removed (nodes an operator removed for good), or advertises cluster
// parameters other than Self's (a node from another cluster, or a new node
// that has not adopted them yet).
//
// Candidates is a pure function of its arguments: the Raft leader passes its
// own clock, and the result decides nothing until the leader acts on it.
func (v View) Candidates(now time.Time, deadTimeout time.Duration, removed map[string]bool) []string {
	self, ok := v.Members[v.Self]
	ids := make([]string, 0, len(v.Members))
	for id, m := range v.Members {
		switch {
		case removed[id], m.Meta.Draining:
			continue
		case ok && m.Meta.ClusterParams() != self.Meta.ClusterParams():
			continue
		case m.State.Live():
		case m.State == Dead || m.State == Left:
			if now.Sub(m.Since) >= deadTimeout {
				continue
			}
		default:
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// ErrNoClusterParams is returned by View.ClusterParams when no live member
// other than Self advertises cluster parameters.
var ErrNoClusterParams = errors.New("membership: no live member advertises cluster parameters")

// ErrClusterParamsDisagree is returned by View.ClusterParams when live
// members advertise different cluster parameters: the seeds belong to more
// than one cluster, or a node was started with the wrong stored parameters.
var ErrClusterParamsDisagree = errors.New("membership: live members advertise different cluster parameters")

// ClusterParams returns the cluster parameters the live members other than
// Self advertise, for a new node to learn and an existing one to check its
// stored parameters against. Members that advertise none are ignored.
func (v View) ClusterParams() (ClusterParams, error) {
	var (
		found ClusterParams
		from  string
		ids   = make([]string, 0, len(v.Members))
	)
	for id := range v.Members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var disagree []string
	for _, id := range ids {
		m := v.Members[id]
		p := m.Meta.ClusterParams()
		if id == v.Self || !m.State.Live() || p.IsZero() {
			continue
		}
		if from == "" {
			found, from = p, id
			continue
		}
		if p != found {
			disagree = append(disagree, fmt.Sprintf("%s has %s", id, p))
		}
	}
	if from == "" {
		return ClusterParams{}, ErrNoClusterParams
	}
	if len(disagree) > 0 {
		return ClusterParams{}, fmt.Errorf("%w: %s has %s; %s", ErrClusterParamsDisagree, from, found, strings.Join(disagree, "; "))
	}
	return found, nil
}
