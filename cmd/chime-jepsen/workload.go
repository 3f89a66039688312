package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// history collects operations from every client and the nemesis. Times are
// the driver's clock (Unix ns).
type history struct {
	mu  sync.Mutex
	ops []checker.Op
}

func (h *history) add(op checker.Op) {
	h.mu.Lock()
	op.Index = len(h.ops)
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

func (h *history) snapshot() []checker.Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]checker.Op(nil), h.ops...)
}

// sent remembers what was scheduled, for re-sends and cancels.
type sent struct {
	id, topic, payload string
	delay              time.Duration
	deliverAt          time.Time // zero when delay was used
	due                time.Time // the driver's estimate
	at                 time.Time // when the id was first sent
	// upsertable: kept apart for upserts (workload.upsertable), out of what
	// the other ops pick from. replace: this send is an upsert of it.
	upsertable, replace bool
	// tenant: tenant A's event (tenants.go), sent with A's token and kept
	// out of what the workload's other ops pick from.
	tenant bool
	// The firing policy every send of the id carries (firingPolicy):
	// priority nil when unset, window 0 when none.
	priority *uint32
	window   time.Duration
}

type workload struct {
	c         *cluster
	h         *history
	maxDelay  time.Duration
	opTimeout time.Duration
	// retention is the cluster's: an id is re-sent only within half of it
	// after its first send, so that no re-send can meet an expired event
	// and create it anew (legal, but the checker would have to tell the
	// two events apart).
	retention time.Duration
	// Bursts (burst.go): burstSize events every burstEvery on one of the
	// cluster's shards shards in turn; none when burstSize or burstEvery is 0.
	shards     int
	burstSize  int
	burstEvery time.Duration
	// tenants: run tenant A's events and the prober (tenants.go); needs
	// --secure, which makes A's token.
	tenants bool
	// ingest, when not nil, produces to the ingest topic (ingest.go) the
	// share ingestShare of the new events.
	ingest      *kgo.Client
	ingestShare float64

	mu     sync.Mutex
	events []sent // every id ever sent (any outcome)
	seq    int
	maxDue time.Time
	// versions is the latest version an ok update reported, by id: what an
	// update with expected_version expects, when it does.
	versions map[string]uint64
	updates  int // updates sent, which numbers their payloads
	// upsertable are ids upserts replace: scheduled like any other, but
	// never cancelled, read or updated by the other ops, so that each
	// record of one is a version an upsert made (a cancelled event renewed
	// would make its later records look produced after the cancel). Their
	// ids are "u%d", the others' "e%d", so that no prefix a list or a bulk
	// cancel takes from an "e" id matches one.
	upsertable []sent
}

// The bounds of a list op: pages of listPageSize, at most listPages of them.
const (
	listPageSize = 50
	listPages    = 10
)

var topics = []string{"jepsen.a", "jepsen.b", "jepsen.c", "jepsen.d"}

// classify turns a call's error into a history type: fail only when the
// request certainly changed nothing.
func classify(err error) (typ, code string) {
	if err == nil {
		return "ok", ""
	}
	st, _ := status.FromError(err)
	if errors.Is(err, client.ErrUnknownOutcome) {
		// The client's word that the call may have taken effect, whatever
		// the code of its last attempt.
		return "info", st.Code().String()
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.AlreadyExists, codes.NotFound, codes.FailedPrecondition:
		return "fail", st.Code().String()
	case codes.Unimplemented:
		// A node of an older build (the upgrade nemesis's) that does not serve the method:
		// gRPC answers so before any handler runs, so nothing was done.
		return "fail", st.Code().String()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "info", codes.DeadlineExceeded.String()
	}
	return "info", st.Code().String()
}

// run starts `clients` workers, a canceller, when ctx has a deadline (the run's end), a
// recurrer, when bursts are on, a burster, and with tenants tenant A's scheduler and the
// prober; they stop when ctx ends.
func (w *workload) run(ctx context.Context, clients int, seed uint64) {
	var wg sync.WaitGroup
	cancels := make(chan sent, 1024)
	for p := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.client(ctx, p, rand.New(rand.NewPCG(seed, uint64(p))), cancels)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.canceller(ctx, clients, rand.New(rand.NewPCG(seed, 999)), cancels)
	}()
	if end, ok := ctx.Deadline(); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.recurrer(ctx, clients+1, rand.New(rand.NewPCG(seed, 0x5c4ed)), end)
		}()
	}
	if w.tenants {
		wg.Add(2)
		go func() {
			defer wg.Done()
			w.tenanter(ctx, clients+3, rand.New(rand.NewPCG(seed, 0x7e4a)))
		}()
		go func() {
			defer wg.Done()
			w.prober(ctx, clients+4, rand.New(rand.NewPCG(seed, 0x960be)))
		}()
	}
	if w.burstSize > 0 && w.burstEvery > 0 && w.shards > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.burster(ctx, clients+2, rand.New(rand.NewPCG(seed, 0xb0257)))
		}()
	}
	wg.Wait()
}

func (w *workload) node(r *rand.Rand) *node {
	ns := w.c.active()
	return ns[r.IntN(len(ns))]
}

// record adds op to the history. After an unknown outcome (a node down or
// unreachable answers at once), the client waits a little, as a real client
// backing off would, instead of filling the history with instant failures.
func (w *workload) record(op checker.Op) {
	w.h.add(op)
	if op.Type == "info" {
		time.Sleep(50 * time.Millisecond)
	}
}

// client runs ops in these shares (per mille): schedule 550 (of which
// --ingest-share through the ingest topic, ingest.go), identical
// re-send 60, conflicting re-send 30, one new id to two nodes 30, cancel 80,
// update 60, upsertable schedule 10, upsert 10, get 115, list 20,
// cancel_matching 5, invalid 30.
func (w *workload) client(ctx context.Context, p int, r *rand.Rand, cancels chan<- sent) {
	for ctx.Err() == nil {
		switch x := r.IntN(1000); {
		case x < 550:
			if w.ingest != nil && r.Float64() < w.ingestShare {
				w.ingestNew(ctx, p, r)
				break
			}
			ev := w.newEvent(r, "e")
			if w.schedule(p, w.node(r), ev) && r.IntN(4) == 0 {
				select { // a quarter of them get cancelled, at various times
				case cancels <- ev:
				default:
				}
			}
		case x < 610:
			if ev, ok := w.pickResend(r); ok {
				w.schedule(p, w.node(r), ev) // identical re-send
			}
		case x < 640:
			if ev, ok := w.pickResend(r); ok {
				ev.payload += "-conflict"
				w.schedule(p, w.node(r), ev)
			}
		case x < 670:
			// The same new id to two nodes at once.
			ev := w.newEvent(r, "e")
			a, b := w.node(r), w.node(r)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); w.schedule(p, a, ev) }()
			go func() { defer wg.Done(); w.schedule(p+1000, b, ev) }()
			wg.Wait()
		case x < 750:
			if ev, ok := w.pick(r); ok {
				w.cancel(p, w.node(r), ev.id) // whenever: before, around or after due
			}
		case x < 810:
			if ev, ok := w.pick(r); ok {
				w.update(p, w.node(r), r, ev.id) // whenever: before, around or after due
			}
		case x < 820:
			ev := w.newEvent(r, "u")
			ev.upsertable = true
			if w.schedule(p, w.node(r), ev) {
				w.mu.Lock()
				w.upsertable = append(w.upsertable, ev)
				w.mu.Unlock()
			}
		case x < 830:
			w.upsert(p, w.node(r), r)
		case x < 945:
			if ev, ok := w.pick(r); ok {
				w.get(p, w.node(r), ev.id)
			}
		case x < 965:
			if prefix, ok := w.pickPrefix(r); ok {
				w.list(p, w.node(r), r, prefix)
			}
		case x < 970:
			if prefix, ok := w.pickPrefix(r); ok {
				w.cancelMatching(p, w.node(r), r, prefix)
			}
		default:
			w.invalid(p, w.node(r), r)
		}
	}
}

// canceller cancels, or updates, some events well before, or within ±50 ms
// of, their due time: around it, a fire batch may hold the event.
func (w *workload) canceller(ctx context.Context, p int, r *rand.Rand, in <-chan sent) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-in:
			at := time.Now().Add(time.Duration(r.Int64N(int64(time.Second))))
			if r.IntN(2) == 0 {
				at = ev.due.Add(time.Duration(r.Int64N(int64(100*time.Millisecond))) - 50*time.Millisecond)
			}
			update := r.IntN(3) == 0
			go func() {
				select {
				case <-ctx.Done():
				case <-time.After(time.Until(at)):
					r := rand.New(rand.NewPCG(uint64(at.UnixNano()), 1))
					if update {
						w.update(p, w.node(r), r, ev.id)
					} else {
						w.cancel(p, w.node(r), ev.id)
					}
				}
			}()
		}
	}
}

// newEvent makes a new event whose id is shape ("e", or "u" for an
// upsertable one) and a number no other id has.
func (w *workload) newEvent(r *rand.Rand, shape string) sent {
	w.mu.Lock()
	w.seq++
	id := shape + strconv.Itoa(w.seq)
	w.mu.Unlock()
	now := time.Now()
	ev := sent{id: id, topic: topics[r.IntN(len(topics))], payload: "p-" + id, at: now}
	ev.delay, ev.deliverAt, ev.due = w.dueTime(r, now)
	ev.priority, ev.window = firingPolicy(r)
	return ev
}

// maxWindow is the longest window firingPolicy gives an event.
const maxWindow = 2 * time.Second

// firingPolicy picks a new event's priority and window: 30% of events get a
// priority, uniform 0-9 (the others leave it unset, which means 5), and 10%
// a window of 100 ms to maxWindow (the others none). An event's priority
// matters only when its shard has a backlog; its window lets it fire
// anywhere up to that long after its due time, which the checker allows.
func firingPolicy(r *rand.Rand) (priority *uint32, window time.Duration) {
	if r.IntN(10) < 3 {
		p := uint32(r.IntN(10))
		priority = &p
	}
	if r.IntN(10) == 0 {
		window = 100*time.Millisecond + time.Duration(r.Int64N(int64(maxWindow-100*time.Millisecond)+1))
	}
	return priority, window
}

// dueTime picks when a new or updated event is due: a delay (deliverAt zero)
// or a time, and the due time either means from now.
func (w *workload) dueTime(r *rand.Rand, now time.Time) (delay time.Duration, deliverAt, due time.Time) {
	switch x := r.IntN(100); {
	case x < 5:
		delay = 0
	case x < 45:
		delay = time.Duration(r.Int64N(int64(2 * time.Second)))
	case x < 75:
		delay = 2*time.Second + time.Duration(r.Int64N(int64(8*time.Second)))
	case x < 90:
		delay = time.Duration(r.Int64N(int64(w.maxDelay)))
	default:
		// Exactly on a wheel tick boundary (1 ms), a little ahead.
		deliverAt = now.Truncate(time.Millisecond).Add(time.Duration(1+r.IntN(3000)) * time.Millisecond)
		return 0, deliverAt, deliverAt
	}
	return delay, time.Time{}, now.Add(delay)
}

// pickResend picks an id to send again: one first sent less than half the
// retention ago, when there is a retention.
func (w *workload) pickResend(r *rand.Rand) (sent, bool) {
	for range 10 {
		ev, ok := w.pick(r)
		if !ok || w.retention <= 0 || time.Since(ev.at) < w.retention/2 {
			return ev, ok
		}
	}
	return sent{}, false
}

func (w *workload) pick(r *rand.Rand) (sent, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events) == 0 {
		return sent{}, false
	}
	// Mostly recent ids, so cancels and gets meet events still pending.
	n := len(w.events)
	i := n - 1 - r.IntN(min(n, 200))
	if r.IntN(5) == 0 {
		i = r.IntN(n)
	}
	return w.events[i], true
}

// pickPrefix picks the id prefix of a list or a bulk cancel: a recent id
// (pick) less its last digit, so that it selects a dozen ids ("e4532" is
// e4532 and e45320-e45329). Only an id with as many digits as the newest one
// and at least three will do: a shorter one would select thousands
// (e12 → "e1": e1, e10-e19, e100-e199, ...).
func (w *workload) pickPrefix(r *rand.Rand) (string, bool) {
	for range 10 {
		ev, ok := w.pick(r)
		if !ok {
			return "", false
		}
		w.mu.Lock()
		digits := len(strconv.Itoa(w.seq))
		w.mu.Unlock()
		if len(ev.id) == 1+digits && digits >= 3 {
			return ev.id[:len(ev.id)-1], true
		}
	}
	return "", false
}

func (w *workload) schedule(p int, n *node, ev sent) bool {
	e := &chimev1.Event{Id: ev.id, Topic: ev.topic, Payload: []byte(ev.payload)}
	op := checker.Op{Process: p, F: checker.FSchedule, Node: n.id, ID: ev.id, Topic: ev.topic, Payload: ev.payload}
	if ev.replace {
		// The checker judges an upsert as an update: it makes a new version.
		e.OnConflict = chimev1.OnConflict_ON_CONFLICT_REPLACE
		op.F, op.Upsert = checker.FUpdate, true
	}
	if ev.deliverAt.IsZero() {
		e.Delay = durationpb.New(ev.delay)
		op.DelayNs = int64(ev.delay)
	} else {
		e.DeliverAt = timestamppb.New(ev.deliverAt)
		op.DeliverAtNs = ev.deliverAt.UnixNano()
	}
	if ev.priority != nil {
		p := *ev.priority
		e.Priority, op.Priority = &p, &p
	}
	if ev.window > 0 {
		e.Window, op.WindowNs = durationpb.New(ev.window), int64(ev.window)
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	op.InvokeNs = time.Now().UnixNano()
	sc := n.scheduler()
	if ev.tenant {
		sc = chimev1.NewSchedulerClient(n.tenant())
	}
	resp, err := sc.Schedule(ctx, &chimev1.ScheduleRequest{Event: e})
	op.CompleteNs = time.Now().UnixNano()
	op.Type, op.Code = classify(err)
	if ev.replace && status.Code(err) == codes.Aborted { // the event was being fired: nothing changed
		op.Type = checker.TypeFail
	}
	if err != nil {
		op.Error = err.Error()
	} else {
		op.AckDueNs, op.Existing = resp.Due.AsTime().UnixNano(), resp.Existing
		if ev.replace {
			op.Version = resp.Version
		}
	}
	w.record(op)
	if op.Type != "fail" {
		w.mu.Lock()
		if !ev.upsertable && !ev.tenant {
			w.events = append(w.events, ev)
		}
		due := ev.due
		if op.AckDueNs != 0 {
			due = time.Unix(0, op.AckDueNs)
		}
		due = due.Add(ev.window) // it may fire that much later
		if due.After(w.maxDue) {
			w.maxDue = due
		}
		w.mu.Unlock()
	}
	return op.Type == "ok"
}

func (w *workload) cancel(p int, n *node, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	op := checker.Op{Process: p, F: "cancel", Node: n.id, ID: id, InvokeNs: time.Now().UnixNano()}
	_, err := n.scheduler().Cancel(ctx, &chimev1.CancelRequest{Id: id})
	op.CompleteNs = time.Now().UnixNano()
	op.Type, op.Code = classify(err)
	if err != nil {
		op.Error = err.Error()
	}
	w.record(op)
}

func (w *workload) get(p int, n *node, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	op := checker.Op{Process: p, F: "get", Node: n.id, ID: id, InvokeNs: time.Now().UnixNano()}
	resp, err := n.scheduler().Get(ctx, &chimev1.GetRequest{Id: id})
	op.CompleteNs = time.Now().UnixNano()
	op.Type, op.Code = classify(err)
	if err != nil {
		op.Error = err.Error()
	} else {
		op.State, op.Version = stateName(resp.State), resp.Version
	}
	w.record(op)
}

// list lists the events whose id starts with prefix (a quarter of the time
// only the scheduled ones), on node n, following next_page_token for up to
// listPages pages of listPageSize. It is ok only when every page was; then
// the op holds every entry (and More when it stopped before the end).
func (w *workload) list(p int, n *node, r *rand.Rand, prefix string) {
	filter := &chimev1.EventFilter{IdPrefix: prefix}
	op := checker.Op{Process: p, F: checker.FList, Node: n.id, Prefix: prefix}
	if r.IntN(4) == 0 {
		filter.States = []chimev1.EventState{chimev1.EventState_EVENT_STATE_SCHEDULED}
		op.States = []string{checker.StateScheduled}
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	var (
		listed []checker.Listed
		token  string
		err    error
	)
	op.InvokeNs = time.Now().UnixNano()
	for op.Pages < listPages {
		var resp *chimev1.ListResponse
		resp, err = n.scheduler().List(ctx, &chimev1.ListRequest{Filter: filter, Limit: listPageSize, PageToken: token})
		if err != nil {
			break
		}
		op.Pages++
		for _, e := range resp.Events {
			l := checker.Listed{ID: e.GetEvent().GetId(), State: stateName(e.State), Version: e.Version}
			if e.Due != nil {
				l.DueNs = e.Due.AsTime().UnixNano()
			}
			listed = append(listed, l)
		}
		if token = resp.NextPageToken; token == "" {
			break
		}
	}
	op.CompleteNs = time.Now().UnixNano()
	op.Type, op.Code = classify(err)
	if err != nil {
		op.Error = err.Error()
	} else {
		op.Listed, op.More = listed, token != ""
	}
	w.record(op)
}

// cancelMatching cancels every pending event whose id starts with prefix (a
// fifth of the time as a dry run) on node n, reading the stream of progress
// to its last message. It streams for as long as the cluster takes, so it
// gets three op timeouts. It is ok only when the last message (done) came,
// fail only when it was refused (INVALID_ARGUMENT, before any step): any
// other error may come after some steps committed, so it is info.
func (w *workload) cancelMatching(p int, n *node, r *rand.Rand, prefix string) {
	op := checker.Op{Process: p, F: checker.FCancelMatching, Node: n.id, Prefix: prefix, DryRun: r.IntN(5) == 0}
	ctx, cancel := context.WithTimeout(context.Background(), 3*w.opTimeout)
	defer cancel()
	op.InvokeNs = time.Now().UnixNano()
	stream, err := n.scheduler().CancelMatching(ctx, &chimev1.CancelMatchingRequest{
		Filter: &chimev1.EventFilter{IdPrefix: prefix}, DryRun: op.DryRun})
	done := false
	for err == nil && !done {
		var m *chimev1.CancelMatchingProgress
		if m, err = stream.Recv(); err == nil {
			op.Matched, op.Cancelled, op.SkippedFired, op.SkippedHeld = m.Matched, m.Cancelled, m.SkippedFired, m.SkippedHeld
			done = m.Done
		}
	}
	op.CompleteNs = time.Now().UnixNano()
	switch {
	case done:
		op.Type = checker.TypeOK
	case errors.Is(err, io.EOF):
		op.Type, op.Error = checker.TypeInfo, "the stream ended before its last message (done)"
	default:
		op.Type, op.Code = classify(err)
		if status.Code(err) != codes.InvalidArgument {
			op.Type = checker.TypeInfo
		}
		op.Error = err.Error()
	}
	w.record(op)
}

// update moves the event id to a new due time, sooner or later, with a
// payload no other op sets; now and then only while it is at the version the
// last ok update of it reported.
func (w *workload) update(p int, n *node, r *rand.Rand, id string) {
	now := time.Now()
	delay, deliverAt, due := w.dueTime(r, now)
	w.mu.Lock()
	w.updates++
	payload := fmt.Sprintf("p-%s-u%d", id, w.updates)
	version := w.versions[id]
	w.mu.Unlock()
	req := &chimev1.UpdateRequest{Id: id, Payload: []byte(payload)}
	op := checker.Op{Process: p, F: checker.FUpdate, Node: n.id, ID: id, Payload: payload}
	if deliverAt.IsZero() {
		req.Delay = durationpb.New(delay)
		op.DelayNs = int64(delay)
	} else {
		req.DeliverAt = timestamppb.New(deliverAt)
		op.DeliverAtNs = deliverAt.UnixNano()
	}
	if version > 0 && r.IntN(3) == 0 {
		req.ExpectedVersion, op.ExpectedVersion = version, version
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	op.InvokeNs = time.Now().UnixNano()
	resp, err := n.scheduler().Update(ctx, req)
	op.CompleteNs = time.Now().UnixNano()
	op.Type, op.Code = classify(err)
	if status.Code(err) == codes.Aborted {
		// An update answers ABORTED only when it changed nothing (the event
		// was being fired); UNKNOWN when it may have.
		op.Type = checker.TypeFail
	}
	if err != nil {
		op.Error = err.Error()
	} else {
		op.AckDueNs, op.Version = resp.Due.AsTime().UnixNano(), resp.Version
		due = resp.Due.AsTime()
	}
	w.record(op)
	if op.Type == checker.TypeFail {
		return
	}
	w.mu.Lock()
	if op.Type == checker.TypeOK && op.Version > w.versions[id] {
		w.versions[id] = op.Version
	}
	// An update leaves the event's window as it was (UpdateRequest has
	// none), which this does not know: as if it had the longest.
	due = due.Add(maxWindow)
	if due.After(w.maxDue) {
		w.maxDue = due
	}
	w.mu.Unlock()
}

// upsert schedules a recent upsertable id again with on_conflict REPLACE, a
// payload no other op sets and a new due time: the event's next version,
// whether it is pending (replaced) or fired (scheduled anew). Only ids first
// sent less than half the retention ago, so that none has expired (an
// upsert of an expired id would make a new first version).
func (w *workload) upsert(p int, n *node, r *rand.Rand) {
	now := time.Now()
	w.mu.Lock()
	var ev sent
	for range 10 {
		if len(w.upsertable) > 0 {
			ev = w.upsertable[len(w.upsertable)-1-r.IntN(min(len(w.upsertable), 50))]
		}
		if w.retention <= 0 || now.Sub(ev.at) < w.retention/2 {
			break
		}
		ev = sent{}
	}
	w.updates++
	n2 := w.updates
	w.mu.Unlock()
	if ev.id == "" {
		return
	}
	ev.payload = fmt.Sprintf("p-%s-r%d", ev.id, n2)
	ev.delay, ev.deliverAt, ev.due = w.dueTime(r, now)
	ev.replace = true
	w.schedule(p, n, ev)
}

func stateName(s chimev1.EventState) string {
	switch s {
	case chimev1.EventState_EVENT_STATE_SCHEDULED:
		return checker.StateScheduled
	case chimev1.EventState_EVENT_STATE_FIRED:
		return checker.StateFired
	case chimev1.EventState_EVENT_STATE_CANCELLED:
		return checker.StateCancelled
	case chimev1.EventState_EVENT_STATE_DEAD_LETTERED:
		return checker.StateDeadLettered
	}
	return s.String()
}

// invalid sends a request that must be refused with INVALID_ARGUMENT and
// leave nothing behind; its id is never used again.
func (w *workload) invalid(p int, n *node, r *rand.Rand) {
	w.mu.Lock()
	w.seq++
	id := fmt.Sprintf("bad%d", w.seq)
	w.mu.Unlock()
	e := &chimev1.Event{Id: id, Topic: "jepsen.a", Delay: durationpb.New(time.Second)}
	switch r.IntN(6) {
	case 0:
		e.Topic = "not a topic"
	case 1:
		e.DeliverAt = timestamppb.Now() // both set
	case 2:
		e.Delay = durationpb.New(-time.Second)
	case 3:
		e.Topic = "__consumer_offsets" // reserved: Kafka's own
	case 4:
		e.Topic = "chime.deadletter" // reserved: Chime's own
	default:
		e.Topic = ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	op := checker.Op{Process: p, F: "invalid", Node: n.id, ID: id, Topic: e.Topic, InvokeNs: time.Now().UnixNano()}
	_, err := n.scheduler().Schedule(ctx, &chimev1.ScheduleRequest{Event: e})
	op.CompleteNs = time.Now().UnixNano()
	op.Type, op.Code = classify(err)
	if err != nil {
		op.Error = err.Error()
	}
	w.record(op)
}
