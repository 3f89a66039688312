package client

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// router sends each call about one id to the leader of the id's shard,
// from the cluster map, which one goroutine (started by newRouter, stopped
// by close) reads whenever a call finds it stale or a leader failed. A
// call never waits for the map: until it is known, and for a shard whose
// leader is not, calls go to the main connection, whose node forwards
// them.
type router struct {
	main  *grpc.ClientConn
	dial  func(addr string) (*grpc.ClientConn, error) // nil: routing off
	every time.Duration

	mu         sync.Mutex
	shardCount uint32
	leaders    []string // grpc address of each shard's leader; "" unknown
	fetched    time.Time
	conns      map[string]*grpc.ClientConn // by address; nil: cannot dial it
	closed     bool

	kick   chan struct{} // asks the loop for a fresh map
	cancel context.CancelFunc
	done   chan struct{} // closed when the loop has returned
}

// mapFetchTimeout bounds one GetClusterMap; minMapInterval spaces them.
const (
	mapFetchTimeout = 5 * time.Second
	minMapInterval  = time.Second
)

func newRouter(main *grpc.ClientConn, dial func(string) (*grpc.ClientConn, error), every time.Duration) *router {
	r := &router{main: main, dial: dial, every: every, conns: map[string]*grpc.ClientConn{}, done: make(chan struct{})}
	if dial == nil {
		close(r.done)
		return r
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.kick, r.cancel = make(chan struct{}, 1), cancel
	r.kick <- struct{}{} // the first map, right away
	go r.loop(ctx)
	return r
}

// pick is the connection of a call about id ("": any node).
func (r *router) pick(id string) conn {
	if r.dial == nil || id == "" {
		return conn{ClientConnInterface: r.main}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.staleLocked()
	return r.pickLocked(id)
}

// staleLocked asks for a fresh map when the one held is old.
func (r *router) staleLocked() {
	if time.Since(r.fetched) > r.every {
		r.refreshLocked()
	}
}

func (r *router) pickLocked(id string) conn {
	if r.shardCount == 0 || r.closed {
		return conn{ClientConnInterface: r.main}
	}
	addr := r.leaders[chimev1.ShardOf(id, r.shardCount)]
	if addr == "" {
		return conn{ClientConnInterface: r.main}
	}
	cc, ok := r.conns[addr]
	if !ok {
		var err error
		if cc, err = r.dial(addr); err != nil {
			cc = nil // (a token that may not go there in plaintext): never
		}
		r.conns[addr] = cc
	}
	if cc == nil {
		return conn{ClientConnInterface: r.main}
	}
	return conn{ClientConnInterface: cc, leader: addr}
}

// split groups the ids by the connection pick gives them: indexes into ids,
// per connection, in order.
func (r *router) split(ids []string, idx []int) ([]conn, [][]int) {
	if r.dial == nil {
		return []conn{{ClientConnInterface: r.main}}, [][]int{idx}
	}
	// One lock and one look at the clock for the whole batch.
	r.mu.Lock()
	defer r.mu.Unlock()
	r.staleLocked()
	var conns []conn
	var groups [][]int
	at := map[conn]int{}
	for _, i := range idx {
		cc := conn{ClientConnInterface: r.main}
		if ids[i] != "" {
			cc = r.pickLocked(ids[i])
		}
		g, ok := at[cc]
		if !ok {
			g = len(conns)
			at[cc] = g
			conns, groups = append(conns, cc), append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return conns, groups
}

// leaderFailed forgets addr as a leader (calls for its shards go to the
// main connection) and asks for a fresh map.
func (r *router) leaderFailed(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, a := range r.leaders {
		if a == addr {
			r.leaders[i] = ""
		}
	}
	r.refreshLocked()
}

// forwarded asks for a fresh map: a node answered that it passed a call on
// to a shard's leader, so a leader the map names has moved (or the map
// named none).
func (r *router) forwarded() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshLocked()
}

func (r *router) refreshLocked() {
	if r.kick == nil || r.closed {
		return
	}
	select {
	case r.kick <- struct{}{}:
	default: // one is already asked for
	}
}

// loop reads the cluster map each time it is asked to, at most once per
// minMapInterval, until ctx is cancelled.
func (r *router) loop(ctx context.Context) {
	defer close(r.done)
	admin := chimev1.NewAdminClient(r.main)
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		if wait := minMapInterval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		fctx, cancel := context.WithTimeout(ctx, mapFetchTimeout)
		m, err := admin.GetClusterMap(fctx, &chimev1.GetClusterMapRequest{})
		cancel()
		r.mu.Lock()
		// Whatever the answer, the next try is a period away (unless a
		// leader fails): a cluster that does not serve the map to this
		// credential is not asked on every call.
		r.fetched = time.Now()
		if err == nil {
			r.setMapLocked(m)
		}
		r.mu.Unlock()
	}
}

func (r *router) setMapLocked(m *chimev1.ClusterMap) {
	if m.GetShardCount() == 0 {
		return
	}
	addrs := map[string]string{}
	for _, mem := range m.GetMembers() {
		if mem.GetGrpcAddr() != "" {
			addrs[mem.GetId()] = mem.GetGrpcAddr()
		}
	}
	leaders := make([]string, m.GetShardCount())
	for _, s := range m.GetShards() {
		if s.GetId() < m.GetShardCount() {
			leaders[s.GetId()] = addrs[s.GetLeader()]
		}
	}
	r.shardCount, r.leaders = m.GetShardCount(), leaders
}

// close stops the loop and closes the leaders' connections (not main).
func (r *router) close() {
	if r.cancel != nil {
		r.cancel()
	}
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, cc := range r.conns {
		if cc != nil {
			_ = cc.Close() // fails only for a connection already closed
		}
	}
	r.conns = map[string]*grpc.ClientConn{}
}
