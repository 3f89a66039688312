package chimetest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/rpctest"
)

// Fake is a Chime cluster in memory for tests, on a virtual clock: a
// client.Scheduler whose events fire when the test calls Advance, into
// Fired, never before they are due. It embeds the *client.Client that talks
// to it, so it has every method of one, and its answers and errors are
// those of a real server (see the package documentation for what it leaves
// out). It is safe for concurrent use; Close it when done.
type Fake struct {
	*client.Client

	clock   *clock
	backend *rpctest.Backend
	gs      *grpc.Server
	served  chan error // Serve's result
	stop    sync.Once

	advancing sync.Mutex // serializes Advance
	mu        sync.Mutex
	fired     []Record
}

var _ client.Scheduler = (*Fake)(nil)

// Option configures NewFake.
type Option func(*fakeOptions)

type fakeOptions struct {
	start  time.Time
	limits rpc.Limits
}

// StartTime sets the virtual clock's first reading (by default the time
// NewFake is called, to the millisecond). Give a fixed time for output
// that does not change from run to run.
func StartTime(t time.Time) Option { return func(o *fakeOptions) { o.start = t } }

// Limits sets the limits the server validates events against, as a
// cluster's flags do (chimed --max-payload, --max-horizon,
// --reserved-topics); zero fields keep their default (rpc.DefaultLimits).
// NewFake panics if lim.Validate fails.
func Limits(lim rpc.Limits) Option { return func(o *fakeOptions) { o.limits = lim } }

// NewFake starts a Fake: the server, listening in memory, and the client
// connected to it. Close stops both.
func NewFake(opts ...Option) *Fake {
	o := fakeOptions{start: time.Now().Truncate(time.Millisecond)}
	for _, opt := range opts {
		opt(&o)
	}
	clk := &clock{now: o.start}
	backend := rpctest.New(clk.Now)
	srv := rpc.NewServer(backend, o.limits, clk.Now, slog.New(slog.DiscardHandler))
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(o.limits.MaxRequestBytes())) // as a node reads
	rpc.Register(gs, srv)
	f := &Fake{clock: clk, backend: backend, gs: gs, served: make(chan error, 1)}
	go func() { f.served <- gs.Serve(lis) }()

	c, err := client.Dial(context.Background(), "passthrough:///chimetest.fake",
		client.WithLeaderRouting(false), // no Admin API to read a cluster map from
		client.WithGRPCDialOptions(
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
		))
	if err != nil {
		// Dial connects lazily: nothing it checks can fail here.
		f.stopServer()
		panic(fmt.Sprintf("chimetest: NewFake: %v", err))
	}
	f.Client = c
	return f
}

// Close closes the client and stops the server. Calls made after Close
// fail; Fired and Now still answer. Closing again does nothing.
func (f *Fake) Close() error {
	err := f.Client.Close()
	f.stopServer()
	return err
}

func (f *Fake) stopServer() {
	f.stop.Do(func() {
		f.gs.Stop()
		<-f.served // Serve returns nil after Stop
	})
}

// Now is the virtual clock's reading: the time the server resolves In
// against, stamps events with, and checks due times against.
func (f *Fake) Now() time.Time { return f.clock.Now() }

// Advance moves the virtual clock forward by d and fires, in order of due
// time (then id), every event and every recurring occurrence that comes
// due meanwhile, each at its own due time, as a cluster that is never late
// would; an event due before Now fires at Now. It returns the records
// fired, which Fired lists too. Nothing fires before it is due: an event
// In(time.Hour) does not fire in Advance(59*time.Minute), and fires in the
// Advance(time.Minute) after. Advance(0) fires what is already due.
//
// Advance panics if d is negative: the clock does not go back.
func (f *Fake) Advance(d time.Duration) []Record {
	if d < 0 {
		panic(fmt.Sprintf("chimetest: Advance(%v): the virtual clock does not go back", d))
	}
	f.advancing.Lock()
	defer f.advancing.Unlock()
	until := f.clock.Now().Add(d)
	var out []Record
	for _, rec := range f.backend.FireUntil(until) {
		out = append(out, record(&rec))
	}
	f.clock.set(until)
	f.mu.Lock()
	f.fired = append(f.fired, out...)
	f.mu.Unlock()
	return slices.Clone(out)
}

// Fired returns every record fired so far, in the order they fired.
func (f *Fake) Fired() []Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.fired)
}

// Record is a record the Fake fired: what a consumer of Topic would read,
// and the event it came from.
type Record struct {
	Topic string
	// Key is the event's key, or its id when it has none, as Chime
	// produces it.
	Key []byte
	// Value is the event's payload (empty, not nil, when it has none), or
	// nil for a tombstone, as Chime produces it.
	Value []byte
	// Headers are the event's headers, then the chime-* headers Chime adds
	// (chime-id, chime-due-unix-ms, chime-fired-unix-ms, chime-attempt,
	// chime-version): client.ParseFired reads them.
	Headers []client.Header
	// Event is the event as Get shows it once fired: State
	// client.StateFired, FiredAt, Version, one attempt.
	Event client.Event
}

// record is the Record of rec, which just fired.
func record(rec *raftfsm.Record) Record {
	ev := client.Event{
		ID:           rec.ID,
		Topic:        rec.Topic,
		Key:          slices.Clone(rec.Key),
		Payload:      slices.Clone(rec.Payload),
		State:        client.StateFired,
		Version:      rec.Version,
		Due:          time.Unix(0, rec.Due).UTC(),
		CreatedAt:    time.Unix(0, rec.CreatedAt).UTC(),
		FiredAt:      time.Unix(0, rec.FiredAt).UTC(),
		Attempts:     int(rec.Attempts),
		Priority:     int(rec.Priority),
		Window:       time.Duration(rec.Window),
		Partition:    rec.Partition,
		HasPartition: rec.HasPartition,
		Tombstone:    rec.Tombstone,
	}
	hs := make([]client.Header, 0, len(rec.Headers)+5)
	for _, h := range rec.Headers {
		ev.Headers = append(ev.Headers, client.Header{Key: h.Key, Value: h.Value})
		hs = append(hs, client.Header{Key: h.Key, Value: h.Value})
	}
	ms := func(ns int64) []byte { return strconv.AppendInt(nil, time.Unix(0, ns).UnixMilli(), 10) }
	hs = append(hs,
		client.Header{Key: chimev1.HeaderID, Value: []byte(rec.ID)},
		client.Header{Key: chimev1.HeaderDue, Value: ms(rec.Due)},
		client.Header{Key: chimev1.HeaderFired, Value: ms(rec.FiredAt)},
		client.Header{Key: chimev1.HeaderAttempt, Value: strconv.AppendUint(nil, uint64(rec.Attempts), 10)},
		client.Header{Key: chimev1.HeaderVersion, Value: strconv.AppendUint(nil, rec.Version, 10)},
	)
	key := rec.Key
	if len(key) == 0 {
		key = []byte(rec.ID)
	}
	value := rec.Payload
	switch {
	case rec.Tombstone:
		value = nil
	case value == nil:
		value = []byte{}
	}
	return Record{Topic: rec.Topic, Key: key, Value: value, Headers: hs, Event: ev}
}

// clock is the Fake's virtual clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
