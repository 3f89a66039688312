package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// fakeAPI is the Scheduler service as the consumer sees it: an id is bound
// to the content it was first scheduled with (REJECT: the same content is
// existing, another is ALREADY_EXISTS; REPLACE: takes its place), a cancel
// cancels, and while down is set every call is UNAVAILABLE. It makes the
// consumer's order, retries and conflict handling exact to check; the real
// request path is checked by chimed's process tests.
type fakeAPI struct {
	chimev1.UnimplementedSchedulerServer
	down    atomic.Bool
	cancels atomic.Int32 // Cancel calls
	// unsure makes a Cancel record the cancel and answer ABORTED, as a
	// shard does when a record of an earlier produce attempt may still
	// reach Kafka.
	unsure atomic.Bool
	// hold makes the next BatchSchedule take that long (nanoseconds),
	// whatever its context: a call already sent whose answer is slow.
	hold atomic.Int64
	held atomic.Bool // a held call is under way

	mu        sync.Mutex
	events    map[string]*chimev1.Event
	cancelled map[string]bool
	log       []string // "schedule id value", "replace id value", "cancel id"
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{events: map[string]*chimev1.Event{}, cancelled: map[string]bool{}}
}

var errDown = status.Error(codes.Unavailable, "no leader")

func (f *fakeAPI) schedule(ev *chimev1.Event) (code codes.Code, msg string) {
	if ev.GetTopic() == "" {
		return codes.InvalidArgument, "events[0].topic: required"
	}
	old, bound := f.events[ev.GetId()]
	switch {
	case bound && ev.GetOnConflict() == chimev1.OnConflict_ON_CONFLICT_REPLACE:
		f.log = append(f.log, "replace "+ev.GetId()+" "+string(ev.GetPayload()))
		delete(f.cancelled, ev.GetId())
	case bound && proto.Equal(old, ev):
		return codes.OK, ""
	case bound:
		return codes.AlreadyExists, "events[0].id: already scheduled with different content"
	default:
		f.log = append(f.log, "schedule "+ev.GetId()+" "+string(ev.GetPayload()))
	}
	stored := proto.Clone(ev).(*chimev1.Event)
	stored.OnConflict = chimev1.OnConflict_ON_CONFLICT_REJECT
	f.events[ev.GetId()] = stored
	return codes.OK, ""
}

func (f *fakeAPI) BatchSchedule(_ context.Context, in *chimev1.BatchScheduleRequest) (*chimev1.BatchScheduleResponse, error) {
	if d := f.hold.Swap(0); d > 0 {
		f.held.Store(true)
		time.Sleep(time.Duration(d))
		f.held.Store(false)
	}
	if f.down.Load() {
		return nil, errDown
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &chimev1.BatchScheduleResponse{}
	for _, ev := range in.GetEvents() {
		code, msg := f.schedule(ev)
		out.Results = append(out.Results, &chimev1.ScheduleResult{Id: ev.GetId(), Code: int32(code), Message: msg})
	}
	return out, nil
}

func (f *fakeAPI) Schedule(_ context.Context, in *chimev1.ScheduleRequest) (*chimev1.ScheduleResponse, error) {
	if f.down.Load() {
		return nil, errDown
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if code, msg := f.schedule(in.GetEvent()); code != codes.OK {
		return nil, status.Error(code, msg)
	}
	return &chimev1.ScheduleResponse{Id: in.GetEvent().GetId()}, nil
}

func (f *fakeAPI) Get(_ context.Context, in *chimev1.GetRequest) (*chimev1.GetResponse, error) {
	if f.down.Load() {
		return nil, errDown
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ev, ok := f.events[in.GetId()]
	if !ok {
		return nil, status.Error(codes.NotFound, "id: no event")
	}
	st := chimev1.EventState_EVENT_STATE_SCHEDULED
	if f.cancelled[in.GetId()] {
		st = chimev1.EventState_EVENT_STATE_CANCELLED
	}
	return &chimev1.GetResponse{Event: proto.Clone(ev).(*chimev1.Event), State: st}, nil
}

func (f *fakeAPI) Cancel(_ context.Context, in *chimev1.CancelRequest) (*chimev1.CancelResponse, error) {
	f.cancels.Add(1)
	if f.down.Load() {
		return nil, errDown
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.events[in.GetId()]; !ok {
		return nil, status.Error(codes.NotFound, "id: no event")
	}
	if !f.cancelled[in.GetId()] {
		f.log = append(f.log, "cancel "+in.GetId())
	}
	f.cancelled[in.GetId()] = true
	if f.unsure.Load() {
		return nil, status.Error(codes.Aborted, "cancelled, but a record from an earlier produce attempt may still reach Kafka")
	}
	return &chimev1.CancelResponse{Id: in.GetId()}, nil
}

func (f *fakeAPI) isCancelled(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cancelled[id]
}

func (f *fakeAPI) applied() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

type harness struct {
	t       *testing.T
	brokers []string
	prod    *kgo.Client
	api     *fakeAPI
}

func newHarness(t *testing.T) *harness { return newHarnessN(t, 1) }

// newHarnessN is a harness whose topics have n partitions.
func newHarnessN(t *testing.T, n int) *harness {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return &harness{t: t, brokers: kc.ListenAddrs(), prod: prod, api: newFakeAPI()}
}

// produce produces one record to "in"; value nil is a tombstone.
func (h *harness) produce(key string, value []byte, headers ...string) {
	h.t.Helper()
	r := &kgo.Record{Topic: "in", Value: value}
	if key != "" {
		r.Key = []byte(key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	if err := h.prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) schedule(key, value string) {
	h.t.Helper()
	h.produce(key, []byte(value), "chime-delay", "1h", "chime-topic", "out")
}

func (h *harness) start(group string) *Consumer {
	h.t.Helper()
	return h.startWith(Config{Group: group})
}

func (h *harness) startWith(cfg Config) *Consumer {
	h.t.Helper()
	cfg.Brokers, cfg.Sources, cfg.API, cfg.Logger = h.brokers, []Source{{Topic: "in"}}, h.api, slog.New(slog.DiscardHandler)
	c, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(c.Close)
	return c
}

// committed is the group's committed offset of partition 0 of "in" (-1:
// none), as the broker has it.
func (h *harness) committed(group string) int64 {
	h.t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = "in", []int32{0}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), h.prod)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			return p.Offset
		}
	}
	return -1
}

func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	h.waitWithin(30*time.Second, what, cond)
}

// waitWithin polls cond, which the consumer's goroutines change, until it
// holds, and fails the test if it does not within d.
func (h *harness) waitWithin(d time.Duration, what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("after %v: %s; applied %q", d, what, h.api.applied())
		}
		<-tick.C
	}
}

// TestOffsetsFollowTheAPI: nothing is committed while the API cannot take
// the records, every one is applied in order once it can, and only then is
// the offset after the last one committed.
func TestOffsetsFollowTheAPI(t *testing.T) {
	h := newHarness(t)
	h.api.down.Store(true)
	h.schedule("a", "1")
	h.schedule("b", "1")
	h.produce("a", nil)
	c := h.start("g")
	h.waitFor("the consumer retried against the unavailable API", func() bool {
		return testCounter(c.m.retries) >= 3
	})
	if got := h.committed("g"); got >= 0 {
		t.Fatalf("offset %d committed while the API refused every record", got)
	}
	h.api.down.Store(false)
	h.waitFor("offset 3 committed", func() bool { return h.committed("g") == 3 })
	// a's tombstone came in the same fetch: a is never scheduled.
	want := []string{"schedule in/b 1"}
	if got := h.api.applied(); !slices.Equal(got, want) {
		t.Errorf("applied %q, want %q", got, want)
	}
	if n := testCounter(c.m.records.WithLabelValues("in", "superseded")); n != 1 {
		t.Errorf("%v records counted superseded, want 1", n)
	}
}

// TestReadingAgainChangesNothing: a group that reads the topic from its
// start again (a crash before any commit, or a lost commit) finds every
// record applied: the same record leaves its event alone, and an older
// record of a key does not replace the newer one.
func TestReadingAgainChangesNothing(t *testing.T) {
	h := newHarness(t)
	h.schedule("k", "old")
	h.schedule("k", "new")
	h.schedule("gone", "1")
	h.produce("gone", nil)
	h.schedule("once", "1")
	h.schedule("back", "1")
	h.produce("back", nil)
	h.schedule("back", "2")
	first := h.start("first")
	h.waitFor("the first group committed 8", func() bool { return h.committed("first") == 8 })
	// Order holds per id; the events of different ids in one run may be
	// applied in any order. The records come in one fetch, so a schedule
	// a later tombstone cancels is not applied at all.
	want := map[string][]string{
		"in/k":    {"schedule in/k old", "replace in/k new"},
		"in/once": {"schedule in/once 1"},
		"in/back": {"schedule in/back 2"},
	}
	if got := byEventID(h.api.applied()); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("applied %q, want %q", got, want)
	}
	first.Close()

	again := h.start("again")
	h.waitFor("the second group committed 8", func() bool { return h.committed("again") == 8 })
	if got := byEventID(h.api.applied()); !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("reading the records again applied %q; want nothing more than %q", got, want)
	}
	if h.api.isCancelled("in/back") {
		t.Error("in/back ended cancelled: its tombstone, read again, cancelled the newer schedule after it")
	}
	// The older record of k, and back's tombstone: read again, it must not
	// cancel the schedule of back that came after it.
	if n := testCounter(again.m.records.WithLabelValues("in", "stale")); n != 2 {
		t.Errorf("%v records counted stale, want 2", n)
	}
}

// TestRejectedRecordsGoOn: a record the format or the API refuses is
// produced to the rejected topic with why and where it came from, and the
// records after it are applied.
func TestRejectedRecordsGoOn(t *testing.T) {
	h := newHarness(t)
	h.produce("", []byte("no key"), "chime-delay", "1s", "chime-topic", "out")
	h.produce("no-topic", []byte("x"), "chime-delay", "1s", "chime-topic", "")
	h.schedule("after", "1")
	c := h.start("g")
	h.waitFor("offset 3 committed", func() bool { return h.committed("g") == 3 })
	if got, want := h.api.applied(), []string{"schedule in/after 1"}; !slices.Equal(got, want) {
		t.Errorf("applied %q, want %q", got, want)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.ConsumeTopics(DefaultRejectedTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var got []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(got) < 2 && ctx.Err() == nil {
		got = append(got, cons.PollFetches(ctx).Records()...)
	}
	if len(got) != 2 {
		t.Fatalf("%d rejected records, want 2", len(got))
	}
	for i, want := range []struct{ key, err, source string }{
		{"", "key: ", "in/0/0"},
		{"no-topic", "", "in/0/1"}, // worded by the format or by the API
	} {
		r := got[i]
		hs := map[string]string{}
		for _, h := range r.Headers {
			hs[h.Key] = string(h.Value)
		}
		if string(r.Key) != want.key || hs[chimev1.HeaderSource] != want.source || !strings.HasPrefix(hs[chimev1.HeaderError], want.err) || !strings.Contains(hs[chimev1.HeaderError], "topic") && want.key != "" {
			t.Errorf("rejected record %d: key %q, headers %v; want key %q, chime-error starting %q, chime-source %q", i, r.Key, hs, want.key, want.err, want.source)
		}
		if hs["chime-topic"] == "" && want.key == "" {
			t.Errorf("rejected record %d lost its own headers: %v", i, hs)
		}
	}
	if n := testCounter(c.m.rejected.WithLabelValues("in", "key")); n != 1 {
		t.Errorf("rejected{reason=key} = %v, want 1", n)
	}
}

// byEventID groups what the fake API applied by the event id.
func byEventID(applied []string) map[string][]string {
	out := map[string][]string{}
	for _, a := range applied {
		id := strings.Fields(a)[1]
		out[id] = append(out[id], a)
	}
	return out
}

// TestDryRunCancelsNothing: a dry run sends its schedules to be validated
// (the Scheduler service schedules none of a dry run's: rpc's
// TestIngestContext) and its cancels nowhere.
func TestDryRunCancelsNothing(t *testing.T) {
	h := newHarness(t)
	h.schedule("a", "1")
	h.produce("b", nil)
	h.api.events["in/b"] = &chimev1.Event{Id: "in/b", Topic: "out"} // scheduled before
	c := h.startWith(Config{Group: "dry", DryRun: true})
	h.waitFor("offset 2 committed", func() bool { return h.committed("dry") == 2 })
	if got, want := h.api.applied(), []string{"schedule in/a 1"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want only %q", got, want)
	}
	if n := h.api.cancels.Load(); n != 0 {
		t.Errorf("%d Cancel calls in a dry run", n)
	}
	if n := testCounter(c.m.records.WithLabelValues("in", "dry_run")); n != 2 {
		t.Errorf("%v records counted dry_run, want 2", n)
	}
}

// TestAnUnsureCancelIsApplied: a cancel the shard recorded but cannot
// vouch for (ABORTED: an earlier produce attempt may still land) is done
// with, not retried forever, and the records after it go on.
func TestAnUnsureCancelIsApplied(t *testing.T) {
	h := newHarness(t)
	h.api.events["in/u"] = &chimev1.Event{Id: "in/u", Topic: "out"}
	h.api.unsure.Store(true)
	h.produce("u", nil)
	h.schedule("after", "1")
	h.start("g")
	h.waitFor("offset 2 committed", func() bool { return h.committed("g") == 2 })
	if got, want := h.api.applied(), []string{"cancel in/u", "schedule in/after 1"}; !slices.Equal(got, want) {
		t.Errorf("applied %q, want %q", got, want)
	}
}

// TestAStuckPartitionLetsTheGroupRebalance: a member whose records wait on
// an API that takes no writes still lets a new member in: it stops, commits
// what it applied, and reads the rest again once the group has settled; every
// record is applied once the API takes writes.
func TestAStuckPartitionLetsTheGroupRebalance(t *testing.T) {
	h := newHarnessN(t, 2)
	h.api.down.Store(true)
	for i := range 20 {
		r := &kgo.Record{Topic: "in", Partition: int32(i % 2), Key: []byte(fmt.Sprint("k", i)), Value: []byte("1"),
			Headers: []kgo.RecordHeader{{Key: "chime-delay", Value: []byte("1h")}, {Key: "chime-topic", Value: []byte("out")}}}
		if err := h.prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	first := h.start("g")
	h.waitFor("the first member holds both partitions, stuck", func() bool {
		return len(first.Status()) == 2 && testCounter(first.m.retries) >= 2
	})
	second := h.start("g")
	// Well within the group's rebalance timeout (60 s), which a member that
	// held on to its poll would make the group wait out.
	h.waitWithin(15*time.Second, "the second member has a partition (else the stuck one held the rebalance)",
		func() bool { return len(second.Status()) > 0 })
	h.api.down.Store(false)
	h.waitFor("every record applied", func() bool { return len(h.api.applied()) == 20 })
}

// TestASlowMemberIsLeftOutOfARebalance: a member whose call does not
// return (it does not heed hurry) is left out of a rebalance after
// rebalanceTimeout, and the member that joined consumes. With Kafka's
// default of 60 s, kfake, which counts a member's session down while it
// waits in the join, dropped the new member unanswered after its session
// timeout, and it consumed nothing until its JoinGroup timed out 70 s on.
func TestASlowMemberIsLeftOutOfARebalance(t *testing.T) {
	h := newHarnessN(t, 2)
	for i := range 20 {
		r := &kgo.Record{Topic: "in", Partition: int32(i % 2), Key: []byte(fmt.Sprint("k", i)), Value: []byte("1"),
			Headers: []kgo.RecordHeader{{Key: "chime-delay", Value: []byte("1h")}, {Key: "chime-topic", Value: []byte("out")}}}
		if err := h.prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	h.api.hold.Store(int64(sessionTimeout + 2*time.Second))
	first := h.start("g")
	h.waitFor("the first member holds both partitions, a call under way", func() bool {
		return len(first.Status()) == 2 && h.api.held.Load()
	})
	second := h.start("g")
	h.waitWithin(rebalanceTimeout+4*time.Second, "the second member has a partition (else the slow one held the rebalance)",
		func() bool { return len(second.Status()) > 0 })
	h.waitFor("every record applied", func() bool { return len(h.api.applied()) == 20 })
}

func TestNotNewer(t *testing.T) {
	for _, tc := range []struct {
		stored, next string
		want         bool
	}{
		{"in/0/5", "in/0/5", true},
		{"in/0/9", "in/0/5", true},
		{"in/0/5", "in/0/9", false},
		{"in/1/9", "in/0/5", false}, // another partition: the latest word
		{"", "in/0/5", false},       // scheduled through the API
		{"a/b/0/9", "a/b/0/5", true},
		{"in/0/x", "in/0/5", false},
	} {
		if got := notNewer(tc.stored, tc.next); got != tc.want {
			t.Errorf("notNewer(%q, %q) = %v, want %v", tc.stored, tc.next, got, tc.want)
		}
	}
}

func testCounter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
