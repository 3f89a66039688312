package raftfsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/golang/snappy"
	"github.com/hashicorp/raft"
)

// quietLogger keeps Pebble's informational lines out of test output; errors still fail loudly
// through returned errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func openTestStore(t testing.TB, dir string, opts StoreOptions) *Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger{}
	}
	if opts.SnapshotFlushWait == 0 {
		// Nothing makes Pebble flush by itself in these tests; without this, every Persist
		// would wait the full default. TestPersistWaitsForPebblesFlush tests the wait.
		opts.SnapshotFlushWait = time.Millisecond
	}
	st, err := OpenStore(dir, opts)
	if err != nil {
		t.Fatalf("OpenStore: %v", err)
	}
	return st
}

// newTestFSM opens shard on st with a recording observer wired to it.
func newTestFSM(t testing.TB, st *Store, shard uint32) (*FSM, *pendingObserver) {
	t.Helper()
	obs := &pendingObserver{t: t, pending: map[uint64]int64{}, policy: map[uint64]Policy{}}
	f, err := NewFSM(st, shard, obs)
	if err != nil {
		t.Fatalf("NewFSM(%d): %v", shard, err)
	}
	obs.fsm = f
	// Start from what is stored, as the shard owner does.
	if !f.NeedsRestore() {
		obs.Reset()
		obs.resets = 0
	}
	return f, obs
}

// pendingObserver keeps the pending set the way the shard owner's wheel would, and fails the
// test on a notification that does not fit (a Settled for an event it never saw scheduled).
type pendingObserver struct {
	t       testing.TB
	fsm     *FSM
	pending map[uint64]int64
	policy  map[uint64]Policy // of the events in pending
	calls   int
	resets  int
}

func (o *pendingObserver) Scheduled(seq uint64, due int64, p Policy) {
	o.calls++
	if _, dup := o.pending[seq]; dup {
		o.t.Errorf("observer: Scheduled(%d) for an event already pending", seq)
	}
	o.pending[seq] = due
	o.policy[seq] = p
}

func (o *pendingObserver) Settled(seq uint64) {
	o.calls++
	if _, ok := o.pending[seq]; !ok {
		o.t.Errorf("observer: Settled(%d) for an event not pending", seq)
	}
	delete(o.pending, seq)
	delete(o.policy, seq)
}

func (o *pendingObserver) Reset() {
	o.resets++
	clear(o.pending)
	clear(o.policy)
	if err := o.fsm.ForEachPending(func(seq uint64, due int64, p Policy) error {
		o.pending[seq] = due
		o.policy[seq] = p
		return nil
	}); err != nil {
		o.t.Errorf("observer: rebuild after Reset: %v", err)
	}
}

// memSink is a raft.SnapshotSink into memory.
type memSink struct {
	bytes.Buffer
	closed, cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

func persist(t testing.TB, snap raft.FSMSnapshot) []byte {
	t.Helper()
	defer snap.Release()
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatalf("Persist: %v", err)
	}
	if !sink.closed || sink.cancelled {
		t.Fatalf("Persist left sink closed=%v cancelled=%v", sink.closed, sink.cancelled)
	}
	return sink.Bytes()
}

func snapshotBytes(t testing.TB, f *FSM) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := f.WriteSnapshot(&buf); err != nil {
		t.Fatalf("WriteSnapshot: %v", err)
	}
	return buf.Bytes()
}

func restore(f *FSM, b []byte) error {
	return f.Restore(nopCloser{bytes.NewReader(b)})
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// kv is one Pebble key and value.
type kv struct{ k, v []byte }

// dumpShard returns every key of shard in st, in order.
func dumpShard(t testing.TB, st *Store, shard uint32) []kv {
	t.Helper()
	lo, hi := shardSpan(shard)
	it, err := st.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	var out []kv
	for valid := it.First(); valid; valid = it.Next() {
		out = append(out, kv{bytes.Clone(it.Key()), bytes.Clone(it.Value())})
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameKeySpace(t testing.TB, what string, a, b []kv) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d keys vs %d keys", what, len(a), len(b))
	}
	for i := range a {
		if !bytes.Equal(a[i].k, b[i].k) || !bytes.Equal(a[i].v, b[i].v) {
			t.Fatalf("%s: key #%d differs:\n  %x = %x\n  %x = %x", what, i, a[i].k, a[i].v, b[i].k, b[i].v)
		}
	}
}

// gen produces commands that collide often: ids come from a small pool, each id has a few
// content variants (same variant → same ContentHash), and marks aim mostly at known seqs.
type gen struct {
	rng   *rand.Rand
	now   int64 // the leader's clock, advancing
	ids   int   // ids issued so far: id-0 … id-(ids-1)
	index uint64
	term  uint64
	// noExpire leaves Expire, Update and Replace out: a log the version before retention
	// could have written.
	noExpire bool
}

func newGen(seed uint64) *gen {
	return &gen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), now: 1_700_000_000e9, term: 1}
}

// id returns a new id or, as often, one issued before (or about to be), so that schedules
// repeat ids and cancels hit every state.
func (g *gen) id() string {
	if g.ids == 0 || g.rng.IntN(5) < 3 {
		g.ids++
		return fmt.Sprintf("id-%d", g.ids-1)
	}
	return fmt.Sprintf("id-%d", g.rng.IntN(g.ids+2))
}

// event builds the event for id with content variant v; Due is freshly resolved, as a leader
// resolving the same relative delay at another time would.
func (g *gen) event(id string, v int) NewEvent {
	e := NewEvent{ID: id, Topic: fmt.Sprintf("topic-%d", v)}
	if v%2 == 0 {
		e.Key = []byte(id)
	}
	if n := (v*37 + len(id)) % 50; n > 0 {
		e.Payload = bytes.Repeat([]byte{byte('a' + v)}, n)
	}
	if v == 2 {
		e.Headers = []Header{{Key: "chime-test", Value: []byte(id)}, {Key: "empty"}}
	}
	e.Policy = DefaultPolicy
	if v%3 == 0 {
		e.Priority = uint8(v % (MaxPriority + 1))
	}
	if v%4 == 1 {
		e.Window = int64(v+1) * 1e6
	}
	if !g.noExpire { // the version before wrote no Output
		switch v {
		case 1:
			e.Partition, e.HasPartition = int32(len(id)%4), true
		case 2:
			e.Payload, e.Tombstone = nil, true
		}
	}
	delay := int64(v+1) * 1e9
	e.ContentHash = ContentHash(e.Topic, e.Key, e.Payload, e.Headers, 0, delay, false, true, e.Policy, e.Output)
	switch g.rng.IntN(10) {
	case 0:
		e.Due = -g.rng.Int64N(1e12) // before 1970: must still order correctly
	case 1:
		e.Due = g.now // ties on due
	default:
		e.Due = g.now + g.rng.Int64N(1e12)
	}
	return e
}

func (g *gen) tick() int64 {
	g.now += g.rng.Int64N(1e9)
	return g.now
}

// command returns a random command that makes sense against m.
func (g *gen) command(m *model) Command {
	switch r := g.rng.IntN(100); {
	case r < 40:
		c := &ScheduleBatch{ProposedAt: g.tick()}
		for range 1 + g.rng.IntN(6) {
			e := g.event(g.id(), g.rng.IntN(3))
			if e.Replace = !g.noExpire && g.rng.IntN(8) == 0; e.Replace && g.rng.IntN(2) == 0 {
				e.CheckPending, e.Pending = true, g.pending(m, e.ID)
			}
			c.Events = append(c.Events, e)
		}
		return c
	case r < 48 && !g.noExpire:
		c := &Update{ProposedAt: g.tick()}
		for range 1 + g.rng.IntN(3) {
			c.Changes = append(c.Changes, g.change(m))
		}
		return c
	case r < 55:
		c := &Cancel{ProposedAt: g.tick()}
		for range 1 + g.rng.IntN(4) {
			c.IDs = append(c.IDs, g.id())
		}
		return c
	case r < 75:
		// Half of them carry due times, as the shard's leader sends them: the due each
		// event had when it was read (for an unknown seq, anything).
		c := &MarkFired{ProposedAt: g.tick(), DueKnown: g.rng.IntN(2) == 0}
		for range 1 + g.rng.IntN(5) {
			e := Fired{Seq: g.seq(m), FiredAt: g.now, Attempts: uint32(1 + g.rng.IntN(3))}
			if r, ok := m.bySeq[e.Seq]; ok && c.DueKnown {
				e.Due = r.Due
			}
			c.Entries = append(c.Entries, e)
		}
		return c
	case r < 90 || g.noExpire:
		c := &MarkDeadLettered{ProposedAt: g.tick(), DueKnown: g.rng.IntN(2) == 0}
		for range 1 + g.rng.IntN(3) {
			e := DeadLettered{
				Seq: g.seq(m), At: g.now, Attempts: uint32(5 + g.rng.IntN(3)),
				Error: fmt.Sprintf("broker said no %d", g.rng.IntN(5)), Topic: "chime-dlq",
			}
			if r, ok := m.bySeq[e.Seq]; ok && c.DueKnown {
				e.Due = r.Due
			}
			c.Entries = append(c.Entries, e)
		}
		return c
	default:
		// Mostly a retention that leaves some settled events, now and then one past all.
		return &Expire{Before: g.now - g.rng.Int64N(8e9) + 1, Limit: uint32(1 + g.rng.IntN(4))}
	}
}

// change returns an update of a random id (usually a known one), changing a random set of
// fields, sometimes on the condition of the event's version (usually its current one).
func (g *gen) change(m *model) Change {
	ch := Change{ID: g.id(), Fields: ChangeFields(g.rng.IntN(int(knownChangeFields) + 1))}
	if g.rng.IntN(3) == 0 {
		ch.IfVersion = 1 + g.rng.Uint64N(2)
		if r, ok := m.byID[ch.ID]; ok && g.rng.IntN(2) == 0 {
			ch.IfVersion = r.Version
		}
	}
	v := g.event(ch.ID, g.rng.IntN(3))
	if ch.Fields&ChangeDue != 0 {
		ch.Due = v.Due
	}
	if ch.Fields&ChangeKey != 0 {
		ch.Key = v.Key
	}
	if ch.Fields&ChangePayload != 0 {
		ch.Payload = v.Payload
	}
	if ch.Fields&ChangeHeaders != 0 {
		ch.Headers = v.Headers
	}
	if ch.Fields&ChangeCheckPending != 0 {
		ch.Pending = g.pending(m, ch.ID)
	}
	return ch
}

// pending returns what a leader would pin for a change of id: usually the seq of its
// pending event (0 if none), sometimes a seq that is no longer it.
func (g *gen) pending(m *model, id string) uint64 {
	if g.rng.IntN(4) == 0 {
		return g.rng.Uint64N(m.nextSeq + 1)
	}
	return m.pendingSeq(id)
}

// seq picks a seq to mark: usually a pending one, sometimes any known one, sometimes unknown.
func (g *gen) seq(m *model) uint64 {
	switch r := g.rng.IntN(10); {
	case r < 6 && len(m.pendingSeqs()) > 0:
		p := m.pendingSeqs()
		return p[g.rng.IntN(len(p))]
	case r < 9 && m.nextSeq > 1:
		return 1 + g.rng.Uint64N(m.nextSeq-1)
	case r == 9:
		return 0
	default:
		return m.nextSeq + g.rng.Uint64N(3)
	}
}

func encode(c Command) []byte {
	switch c := c.(type) {
	case *ScheduleBatch:
		return AppendScheduleBatch(nil, c)
	case *Cancel:
		return AppendCancel(nil, c)
	case *MarkFired:
		return AppendMarkFired(nil, c)
	case *MarkDeadLettered:
		return AppendMarkDeadLettered(nil, c)
	case *Expire:
		return AppendExpire(nil, c)
	case *Update:
		return AppendUpdate(nil, c)
	case *Recurring:
		return AppendRecurring(nil, c)
	}
	panic(fmt.Sprintf("encode %T", c))
}

// entry wraps the next log entry: a command, or (rarely) a configuration change, which the
// FSM must count as applied too.
func (g *gen) entry(m *model) (*raft.Log, Command) {
	g.index++
	if g.rng.IntN(20) == 0 {
		g.term++
		return &raft.Log{Index: g.index, Term: g.term, Type: raft.LogConfiguration, Data: []byte("conf")}, nil
	}
	c := g.command(m)
	return &raft.Log{Index: g.index, Term: g.term, Type: raft.LogCommand, Data: encode(c)}, c
}

// plainStream returns a full snapshot stream with the body after its header decompressed,
// so that a test can edit its frames; packStream compresses such a body again.
func plainStream(t testing.TB, stream []byte) []byte {
	t.Helper()
	body, err := io.ReadAll(snappy.NewReader(bytes.NewReader(stream[snapshotHeaderLen:])))
	if err != nil {
		t.Fatalf("plainStream: %v", err)
	}
	return append(bytes.Clone(stream[:snapshotHeaderLen]), body...)
}

func packStream(t testing.TB, plain []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	out.Write(plain[:snapshotHeaderLen])
	zw := snappy.NewBufferedWriter(&out)
	if _, err := zw.Write(plain[snapshotHeaderLen:]); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// frame is one key/value frame of a snapshot stream (the key without the shard prefix).
type frame struct{ key, val []byte }

// splitStream returns a full stream's header and frames, decompressing a format 3 body.
func splitStream(t testing.TB, stream []byte) (header []byte, frames []frame) {
	t.Helper()
	stream = plainStream(t, stream)
	rest := stream[snapshotHeaderLen:]
	next := func() []byte {
		n, w := binary.Uvarint(rest)
		if w <= 0 || uint64(len(rest)-w) < n {
			t.Fatal("splitStream: malformed stream")
		}
		b := rest[w : w+int(n)]
		rest = rest[w+int(n):]
		return b
	}
	for {
		key := next()
		if len(key) == 0 {
			return bytes.Clone(stream[:snapshotHeaderLen]), frames
		}
		frames = append(frames, frame{key, next()})
	}
}

// joinStream writes header and frames as a stream with a freshly computed trailer, as a
// sender that means harm would; the body is compressed unless the header says format 2.
func joinStream(t testing.TB, header []byte, frames []frame) []byte {
	t.Helper()
	out := bytes.Clone(header)
	for _, f := range frames {
		out = binary.AppendUvarint(out, uint64(len(f.key)))
		out = append(out, f.key...)
		out = binary.AppendUvarint(out, uint64(len(f.val)))
		out = append(out, f.val...)
	}
	out = binary.AppendUvarint(out, 0)
	out = binary.BigEndian.AppendUint64(out, uint64(len(frames)))
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
	if binary.BigEndian.Uint32(header[len(snapshotMagic):]) == snapshotFormatOld {
		return out
	}
	return packStream(t, out)
}

// awaitPending waits for f's pending set to be built and takes it in, as the next apply
// would. It must not run beside an apply.
func awaitPending(t testing.TB, f *FSM) {
	t.Helper()
	for !f.pending.loaded {
		f.pollPending()
		if b := f.pending.build; b != nil {
			<-b.done
		}
	}
}

// wantPendingSet fails unless f's loaded pending set holds exactly the seqs of its due index.
func wantPendingSet(t testing.TB, f *FSM) {
	t.Helper()
	n := 0
	if err := f.ForEachPending(func(seq uint64, _ int64, _ Policy) error {
		n++
		if pending, known := f.pending.has(seq); !pending || !known {
			t.Fatalf("event %d is in the due index; the pending set has it %v (loaded %v)", seq, pending, known)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := f.pending.set.count(); got != n {
		t.Fatalf("pending set holds %d events, the due index %d", got, n)
	}
	wantDueCounts(t, f)
}
