package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/status"
)

// BatcherConfig tunes a Batcher. Zero fields take their defaults.
type BatcherConfig struct {
	// Linger is how long an added event may wait for others to share its
	// ScheduleBatch call (default 5ms). A batch of MaxEvents goes at once.
	Linger time.Duration
	// MaxEvents is the most events one ScheduleBatch call carries (default
	// 500).
	MaxEvents int
	// MaxPending is the most events added and not yet answered (default
	// 10000): Add waits for room beyond it, which bounds the memory a
	// Batcher holds and slows callers to the rate the cluster takes.
	MaxPending int
	// MaxInFlight is the most ScheduleBatch calls under way at once
	// (default 8). One call at a time would cap a Batcher at MaxEvents per
	// round trip; a cluster commits several shards' batches in one fsync
	// each, so a few calls in flight keep every shard leader busy.
	MaxInFlight int
}

// The defaults of BatcherConfig's fields.
const (
	DefaultBatcherLinger      = 5 * time.Millisecond
	DefaultBatcherMaxEvents   = 500
	DefaultBatcherMaxPending  = 10000
	DefaultBatcherMaxInFlight = 8
)

// ErrBatcherClosed is the error of an Add after (or during) the Batcher's
// Close.
var ErrBatcherClosed = errors.New("chime: batcher closed")

// Batcher schedules events added one at a time, from any number of
// goroutines, in batches: it gathers them for up to Linger, or until
// MaxEvents are waiting, and sends them together with ScheduleBatch, up to
// MaxInFlight calls at a time. Each event is answered on its own Pending, with the
// Result or the error ScheduleBatch gave it, worded as Schedule would word
// it (an *InvalidError names "event.topic", not "events[17].topic"): a
// refused event does not fail the others.
//
// Events are sent as Schedule would send them, ids picked by ScheduleBatch
// when empty, and retried by the Scheduler within its RetryPolicy (whose
// Budget bounds each call of a *Client: the Batcher adds no deadline of
// its own). Options that
// can be an event's own (At, Priority other than 0, Window) travel with
// each event; events added with other In durations, with Replace, or with
// Priority(0), are sent in separate calls. For events due at varied times,
// At (or Event.Due) batches best.
//
// A Batcher is safe for concurrent use. It runs one goroutine, from
// NewBatcher until Close, and one per call in flight, which that goroutine
// waits for before it returns.
type Batcher struct {
	s   Scheduler
	cfg BatcherConfig

	room chan struct{} // one token per event added and not yet answered

	mu     sync.Mutex
	queue  []*Pending // added, not yet sent, in order
	closed bool

	inFlight chan struct{}  // one token per ScheduleBatch call under way
	sends    sync.WaitGroup // the calls under way

	wake    chan struct{}      // the queue became non-empty, or full (capacity 1)
	flushes chan chan struct{} // Flush asks the owner to send all it has
	stop    chan struct{}      // closed by Close
	done    chan struct{}      // closed when the owner goroutine returns
	closing sync.Once
}

// NewBatcher returns a Batcher that schedules with s (a *Client, or a
// chimetest.Fake in tests). Close it when done, to send what it still
// holds and stop its goroutine. NewBatcher panics if a field of cfg is
// negative.
func NewBatcher(s Scheduler, cfg BatcherConfig) *Batcher {
	if cfg.Linger < 0 || cfg.MaxEvents < 0 || cfg.MaxPending < 0 || cfg.MaxInFlight < 0 {
		panic(fmt.Sprintf("chime: NewBatcher: negative field in %+v", cfg))
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultBatcherLinger
	}
	if cfg.MaxEvents == 0 {
		cfg.MaxEvents = DefaultBatcherMaxEvents
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = DefaultBatcherMaxPending
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultBatcherMaxInFlight
	}
	b := &Batcher{
		s:        s,
		cfg:      cfg,
		room:     make(chan struct{}, cfg.MaxPending),
		inFlight: make(chan struct{}, cfg.MaxInFlight),
		wake:     make(chan struct{}, 1),
		flushes:  make(chan chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go b.run()
	return b
}

// Pending is the answer to come for one event added to a Batcher.
type Pending struct {
	ev    Event
	key   batchKey
	added time.Time
	done  chan struct{}
	res   Result
	err   error
	room  chan struct{} // the Batcher's, to give the event's token back; nil when it took none
}

// Wait returns the event's Result once its batch is answered, or ctx's
// error if ctx is done first (the event is still sent). The error is the
// event's own (as ScheduleBatch's Result.Err gives it), the context's
// error of the Add that could not find room, or ErrBatcherClosed.
func (p *Pending) Wait(ctx context.Context) (Result, error) {
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// Done is closed when the event's answer is in: Wait then returns at once.
func (p *Pending) Done() <-chan struct{} { return p.done }

func (p *Pending) finish(res Result, err error) {
	p.res, p.err = res, err
	if p.room != nil {
		<-p.room
	}
	close(p.done)
}

func failed(id string, err error) *Pending {
	p := &Pending{done: make(chan struct{})}
	p.finish(Result{ID: id}, err)
	return p
}

// Add queues ev to be scheduled with opts, and returns its Pending. When
// MaxPending events are waiting for their answer, Add waits for one to be
// answered; if ctx is done first, the event is not added and the Pending
// reports ctx's error. After Close, the Pending reports ErrBatcherClosed.
// Once added, the event is sent even if ctx is done later.
func (b *Batcher) Add(ctx context.Context, ev Event, opts ...ScheduleOption) *Pending {
	p := &Pending{done: make(chan struct{})}
	p.ev, p.key = foldOptions(ev, scheduleOpts(opts))
	select {
	case b.room <- struct{}{}:
	case <-ctx.Done():
		return failed(ev.ID, ctx.Err())
	case <-b.stop:
		return failed(ev.ID, ErrBatcherClosed)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.room
		return failed(ev.ID, ErrBatcherClosed)
	}
	p.room, p.added = b.room, time.Now()
	b.queue = append(b.queue, p)
	n := len(b.queue)
	b.mu.Unlock()
	if n == 1 || n >= b.cfg.MaxEvents {
		select {
		case b.wake <- struct{}{}:
		default: // the owner has a wake-up coming already
		}
	}
	return p
}

// Flush sends every event added before it and waits until they are
// answered, or until ctx is done (the events are sent all the same).
func (b *Batcher) Flush(ctx context.Context) error {
	sent := make(chan struct{})
	select {
	case b.flushes <- sent:
	case <-b.done:
		return nil // Close sent everything
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-sent:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close sends the events added so far, waits until they are answered, and
// stops the Batcher: a later Add fails with ErrBatcherClosed, as does an
// Add waiting for room. Close does not close the Scheduler. It returns
// nil; closing again does nothing.
func (b *Batcher) Close() error {
	b.closing.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		close(b.stop)
	})
	<-b.done
	return nil
}

// run is the owner goroutine: it sends a batch when MaxEvents are queued,
// when the oldest queued event has lingered for Linger, on Flush, and on
// Close, after which it returns.
func (b *Batcher) run() {
	defer close(b.done)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	for {
		b.mu.Lock()
		n := len(b.queue)
		var first time.Time
		if n > 0 {
			first = b.queue[0].added
		}
		b.mu.Unlock()
		var lingered <-chan time.Time
		switch {
		case n >= b.cfg.MaxEvents:
			b.dispatch(b.take())
			continue
		case n > 0:
			linger.Reset(time.Until(first.Add(b.cfg.Linger)))
			lingered = linger.C
		}
		select {
		case <-b.wake:
		case <-lingered:
			b.dispatch(b.take())
		case sent := <-b.flushes:
			b.drain()
			close(sent)
		case <-b.stop:
			b.drain()
			return
		}
	}
}

// drain sends everything queued now and waits until every call under way
// is answered; what is added meanwhile waits for the next batch, so that a
// steady stream of Adds cannot hold up a Flush.
func (b *Batcher) drain() {
	b.mu.Lock()
	q := b.queue
	b.queue = nil
	b.mu.Unlock()
	for len(q) > 0 {
		n := min(len(q), b.cfg.MaxEvents)
		b.dispatch(q[:n])
		q = q[n:]
	}
	b.sends.Wait()
}

// dispatch sends batch in a call of its own once fewer than MaxInFlight
// are under way; until then the owner waits, and Adds queue up behind it.
func (b *Batcher) dispatch(batch []*Pending) {
	b.inFlight <- struct{}{}
	b.sends.Go(func() {
		defer func() { <-b.inFlight }()
		b.send(batch)
	})
}

// take removes up to MaxEvents events from the head of the queue.
func (b *Batcher) take() []*Pending {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(len(b.queue), b.cfg.MaxEvents)
	batch := make([]*Pending, n)
	copy(batch, b.queue)
	clear(b.queue[:n]) // let the answered events go
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // start the next batch on a fresh array
	}
	return batch
}

// send schedules batch, one ScheduleBatch call per set of options, and
// answers every Pending.
func (b *Batcher) send(batch []*Pending) {
	groups := map[batchKey][]*Pending{}
	var order []batchKey
	for _, p := range batch {
		if _, ok := groups[p.key]; !ok {
			order = append(order, p.key)
		}
		groups[p.key] = append(groups[p.key], p)
	}
	for _, k := range order {
		ps := groups[k]
		evs := make([]Event, len(ps))
		for i, p := range ps {
			evs[i] = p.ev
		}
		res, err := b.s.ScheduleBatch(context.Background(), evs, k.options()...)
		// A *BatchError (or none) comes with a Result per event, each with
		// its own error; any other error is every event's.
		var be *BatchError
		perEvent := len(res) == len(evs) && (err == nil || errors.As(err, &be))
		if err == nil && !perEvent {
			err = fmt.Errorf("chime: batcher: ScheduleBatch answered %d results for %d events", len(res), len(evs))
		}
		for i, p := range ps {
			switch {
			case perEvent && be != nil && i < len(be.Errs) && be.Errs[i] != nil:
				p.finish(res[i], asSingle(be.Errs[i], i))
			case perEvent:
				p.finish(res[i], asSingle(res[i].Err, i))
			default:
				p.finish(Result{ID: p.ev.ID}, err)
			}
		}
	}
}

// batchKey is what of an Add's options the event cannot carry itself:
// events whose keys differ go in different calls.
type batchKey struct {
	in         time.Duration
	hasIn      bool
	replace    bool
	lowestPrio bool // Priority(0), which Event.Priority 0 does not mean
}

func (k batchKey) options() []ScheduleOption {
	var opts []ScheduleOption
	if k.hasIn {
		opts = append(opts, In(k.in))
	}
	if k.replace {
		opts = append(opts, Replace())
	}
	if k.lowestPrio {
		opts = append(opts, Priority(0))
	}
	return opts
}

// foldOptions moves what of so ev can carry into ev, as ScheduleBatch
// would apply it, and returns the rest as a batchKey.
func foldOptions(ev Event, so scheduleOptions) (Event, batchKey) {
	k := batchKey{hasIn: so.hasIn, replace: so.replace}
	switch {
	case so.hasIn:
		k.in = so.in
	case !so.at.IsZero():
		ev.Due = so.at
	}
	if so.priority != nil {
		if *so.priority == 0 {
			k.lowestPrio = true
			ev.Priority = 0
		} else {
			ev.Priority = *so.priority
		}
	}
	if so.window != 0 {
		ev.Window = so.window
	}
	return ev, k
}

// asSingle is the error of event i of a ScheduleBatch call as Schedule
// would report it: an *InvalidError's path "events[i].topic" becomes
// "event.topic", in its status's message too. The caller of Add added one
// event; where it sat in a call is the Batcher's business.
func asSingle(err error, i int) error {
	ie, ok := err.(*InvalidError)
	if !ok {
		return err
	}
	prefix := "events[" + strconv.Itoa(i) + "]"
	rest, ok := strings.CutPrefix(ie.Field, prefix)
	if !ok {
		return err
	}
	out := &InvalidError{Field: "event" + rest, Rule: ie.Rule, st: ie.st}
	if ie.st != nil {
		p := ie.st.Proto()
		p.Message = strings.Replace(p.Message, prefix, "event", 1)
		out.st = status.FromProto(p)
	}
	return out
}
