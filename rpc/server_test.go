package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/rpctest"
	"github.com/chimehq/chime/shard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Compile-time proof that the test backend is a Backend.
var _ rpc.Backend = (*rpctest.Backend)(nil)

// t0 is the start of every test clock.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// clock is a settable clock shared by the server and the test backend.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// syncBuffer collects log output written from server goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type env struct {
	clock   *clock
	backend *rpctest.Backend
	client  chimev1.SchedulerClient
	conn    *grpc.ClientConn
	log     *syncBuffer
}

// start serves a real gRPC server with the rpc.Server over b (a fresh
// rpctest.Backend when nil) on a loopback port, and returns a client for it.
func start(t *testing.T, lim rpc.Limits, b rpc.Backend, opts ...grpc.ServerOption) *env {
	t.Helper()
	e := &env{clock: &clock{now: t0}, log: &syncBuffer{}}
	e.backend = rpctest.New(e.clock.Now)
	if b == nil {
		b = e.backend
	}
	logger := slog.New(slog.NewTextHandler(e.log, nil))
	srv := rpc.NewServer(b, lim, e.clock.Now, logger)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	rpc.Register(gs, srv)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(ln) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn = conn
	e.client = chimev1.NewSchedulerClient(conn)
	return e
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// validEvent is an event every rule accepts.
func validEvent() *chimev1.Event {
	return &chimev1.Event{
		Id:      "order-42",
		Delay:   durationpb.New(2 * time.Second),
		Topic:   "orders.reminders",
		Key:     []byte("customer-7"),
		Payload: []byte(`{"remind":true}`),
		Headers: []*chimev1.Header{{Key: "trace", Value: []byte("abc")}, {Key: "trace", Value: []byte("def")}},
	}
}

func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v is not a gRPC status", err)
	}
	if st.Code() != code || st.Message() != msg {
		t.Fatalf("got %v: %q\nwant %v: %q", st.Code(), st.Message(), code, msg)
	}
}

func headers(n int) []*chimev1.Header {
	hs := make([]*chimev1.Header, n)
	for i := range hs {
		hs[i] = &chimev1.Header{Key: fmt.Sprintf("h%d", i)}
	}
	return hs
}

// invalidCases are the validation rules, each as an edit to validEvent (or
// a replacement of it) and the exact message, without the "event" path
// prefix, so the batch test can reuse them under "events[i]".
func invalidCases() []struct {
	name string
	edit func(ev *chimev1.Event) *chimev1.Event
	msg  string // after the path prefix ("event" or "events[i]")
} {
	ts := func(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
	horizon := t0.Add(10 * 365 * 24 * time.Hour)
	return []struct {
		name string
		edit func(ev *chimev1.Event) *chimev1.Event
		msg  string
	}{
		{"id too long", func(ev *chimev1.Event) *chimev1.Event { ev.Id = strings.Repeat("x", 257); return ev },
			".id: 257 bytes, at most 256 allowed"},
		{"topic missing", func(ev *chimev1.Event) *chimev1.Event { ev.Topic = ""; return ev },
			".topic: required"},
		{"topic with a space", func(ev *chimev1.Event) *chimev1.Event { ev.Topic = "a b"; return ev },
			`.topic: "a b" is not a valid Kafka topic name (1-249 characters of [a-zA-Z0-9._-], not "." or "..")`},
		{"topic dot dot", func(ev *chimev1.Event) *chimev1.Event { ev.Topic = ".."; return ev },
			`.topic: ".." is not a valid Kafka topic name (1-249 characters of [a-zA-Z0-9._-], not "." or "..")`},
		{"topic too long", func(ev *chimev1.Event) *chimev1.Event { ev.Topic = strings.Repeat("t", 250); return ev },
			`.topic: 250 characters is not a valid Kafka topic name (1-249 characters of [a-zA-Z0-9._-], not "." or "..")`},
		{"a Kafka internal topic", func(ev *chimev1.Event) *chimev1.Event { ev.Topic = "__consumer_offsets"; return ev },
			`.topic: "__consumer_offsets" is reserved: names starting with "__" are Kafka's internal topics (chimed --allow-topic __consumer_offsets lets events target it)`},
		{"the dead-letter topic", func(ev *chimev1.Event) *chimev1.Event { ev.Topic = "chime.deadletter"; return ev },
			`.topic: "chime.deadletter" is reserved: it is one of Chime's own topics (chimed --allow-topic chime.deadletter lets events target it)`},
		{"both deliver_at and delay", func(ev *chimev1.Event) *chimev1.Event { ev.DeliverAt = ts(t0); return ev },
			": set exactly one of deliver_at and delay (both are set)"},
		{"neither deliver_at nor delay", func(ev *chimev1.Event) *chimev1.Event { ev.Delay = nil; return ev },
			": set exactly one of deliver_at and delay (neither is set)"},
		{"deliver_at invalid", func(ev *chimev1.Event) *chimev1.Event {
			ev.Delay = nil
			ev.DeliverAt = &timestamppb.Timestamp{Seconds: t0.Unix(), Nanos: 2e9}
			return ev
		}, ".deliver_at: not a valid Timestamp: " + (&timestamppb.Timestamp{Seconds: t0.Unix(), Nanos: 2e9}).CheckValid().Error()},
		{"deliver_at beyond the horizon", func(ev *chimev1.Event) *chimev1.Event {
			ev.Delay = nil
			ev.DeliverAt = ts(horizon.Add(time.Nanosecond))
			return ev
		}, ".deliver_at: 2036-02-27T12:00:00.000000001Z is more than 10y ahead (--max-horizon)"},
		{"deliver_at before int64 nanoseconds", func(ev *chimev1.Event) *chimev1.Event {
			ev.Delay = nil
			ev.DeliverAt = ts(time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC))
			return ev
		}, ".deliver_at: 1600-01-01T00:00:00Z is outside the times Chime can store (1677-09-21T00:12:43.145224192Z to 2262-04-11T23:47:16.854775807Z)"},
		{"delay negative", func(ev *chimev1.Event) *chimev1.Event { ev.Delay = durationpb.New(-5 * time.Second); return ev },
			".delay: must not be negative (got -5s)"},
		{"delay invalid", func(ev *chimev1.Event) *chimev1.Event {
			ev.Delay = &durationpb.Duration{Seconds: 1, Nanos: -1}
			return ev
		},
			".delay: not a valid Duration: " + (&durationpb.Duration{Seconds: 1, Nanos: -1}).CheckValid().Error()},
		{"delay beyond the horizon", func(ev *chimev1.Event) *chimev1.Event {
			ev.Delay = durationpb.New(10*365*24*time.Hour + time.Second)
			return ev
		}, ".delay: 87600h0m1s is more than 10y (--max-horizon)"},
		{"delay beyond time.Duration", func(ev *chimev1.Event) *chimev1.Event {
			ev.Delay = &durationpb.Duration{Seconds: 300 * 365 * 24 * 3600}
			return ev
		}, ".delay: 9460800000s is more than 10y (--max-horizon)"},
		{"key too long", func(ev *chimev1.Event) *chimev1.Event { ev.Key = make([]byte, 16<<10+1); return ev },
			".key: 16385 bytes, at most 16384 allowed"},
		{"payload too long", func(ev *chimev1.Event) *chimev1.Event { ev.Payload = make([]byte, 1<<20+1); return ev },
			".payload: 1048577 bytes, at most 1048576 allowed (--max-payload)"},
		{"too many headers", func(ev *chimev1.Event) *chimev1.Event { ev.Headers = headers(65); return ev },
			".headers: 65 headers, at most 64 allowed"},
		{"reserved header", func(ev *chimev1.Event) *chimev1.Event {
			ev.Headers = append(ev.Headers, &chimev1.Header{Key: "chime-id", Value: []byte("spoof")})
			return ev
		}, `.headers[2].key: the "chime-" prefix is reserved for headers Chime adds`},
		{"reserved header in another case", func(ev *chimev1.Event) *chimev1.Event {
			ev.Headers[0].Key = "Chime-Due-Unix-Ms"
			return ev
		}, `.headers[0].key: the "chime-" prefix is reserved for headers Chime adds`},
		{"priority above 9", func(ev *chimev1.Event) *chimev1.Event { ev.Priority = proto.Uint32(10); return ev },
			".priority: 10 is not a priority: 0 (lowest) to 9 (highest), 5 when unset"},
		{"window negative", func(ev *chimev1.Event) *chimev1.Event { ev.Window = durationpb.New(-time.Second); return ev },
			".window: must not be negative (got -1s)"},
		{"window too long", func(ev *chimev1.Event) *chimev1.Event { ev.Window = durationpb.New(25 * time.Hour); return ev },
			".window: 25h0m0s is longer than 24h0m0s"},
		{"partition negative", func(ev *chimev1.Event) *chimev1.Event { ev.Partition = proto.Int32(-1); return ev },
			".partition: -1, must be 0 or more (unset: Kafka's partitioner picks one from the key)"},
		{"tombstone with a payload", func(ev *chimev1.Event) *chimev1.Event { ev.Tombstone = true; return ev },
			".payload: 15 bytes with tombstone set, must be empty (a tombstone's record has a null value)"},
		{"headers too large", func(ev *chimev1.Event) *chimev1.Event {
			ev.Headers = []*chimev1.Header{{Key: "a", Value: make([]byte, 40000)}, {Key: "b", Value: make([]byte, 25535)}}
			return ev
		}, ".headers: 65537 bytes of keys and values, at most 65536 allowed"},
	}
}

func TestScheduleRejectsInvalidEventsAndChangesNothing(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	t.Run("event missing", func(t *testing.T) {
		_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{})
		wantStatus(t, err, codes.InvalidArgument, "event: required")
	})
	for _, tc := range invalidCases() {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: tc.edit(validEvent())})
			wantStatus(t, err, codes.InvalidArgument, "event"+tc.msg)
		})
	}
	if calls := e.backend.Calls(); len(calls) != 0 {
		t.Fatalf("the backend saw %d calls for invalid requests: %+v", len(calls), calls)
	}
}

func TestLimitsAreConfigurable(t *testing.T) {
	e := start(t, rpc.Limits{MaxPayloadBytes: 10, MaxHorizon: 90 * time.Minute, MaxKeyBytes: 3, MaxHeaders: 1, MaxIDBytes: 8}, nil)
	for _, tc := range []struct {
		edit func(ev *chimev1.Event)
		msg  string
	}{
		{func(ev *chimev1.Event) { ev.Payload = make([]byte, 11) }, "event.payload: 11 bytes, at most 10 allowed (--max-payload)"},
		{func(ev *chimev1.Event) { ev.Delay = durationpb.New(91 * time.Minute) }, "event.delay: 1h31m0s is more than 1h30m (--max-horizon)"},
		{func(ev *chimev1.Event) { ev.Delay, ev.DeliverAt = nil, timestamppb.New(t0.Add(2*time.Hour)) },
			"event.deliver_at: 2026-03-01T14:00:00Z is more than 1h30m ahead (--max-horizon)"},
		{func(ev *chimev1.Event) { ev.Key = []byte("abcd") }, "event.key: 4 bytes, at most 3 allowed"},
		{func(ev *chimev1.Event) { ev.Id = "123456789" }, "event.id: 9 bytes, at most 8 allowed"},
		{func(ev *chimev1.Event) {}, "event.headers: 2 headers, at most 1 allowed"},
	} {
		ev := validEvent()
		ev.Id, ev.Key, ev.Payload = "ok", []byte("k"), []byte("p")
		tc.edit(ev)
		_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
		wantStatus(t, err, codes.InvalidArgument, tc.msg)
	}
	if calls := e.backend.Calls(); len(calls) != 0 {
		t.Fatalf("the backend saw %d calls for invalid requests", len(calls))
	}
}

func TestScheduleAcceptsEventsAtTheLimits(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	for _, tc := range []struct {
		name string
		edit func(ev *chimev1.Event)
		due  time.Time
	}{
		{"id of 256 bytes", func(ev *chimev1.Event) { ev.Id = strings.Repeat("i", 256) }, t0.Add(2 * time.Second)},
		{"payload of 1 MiB", func(ev *chimev1.Event) { ev.Id = "p"; ev.Payload = make([]byte, 1<<20) }, t0.Add(2 * time.Second)},
		{"64 headers", func(ev *chimev1.Event) { ev.Id = "h"; ev.Headers = headers(64) }, t0.Add(2 * time.Second)},
		{"header named chime without dash", func(ev *chimev1.Event) {
			ev.Id = "c"
			ev.Headers = []*chimev1.Header{{Key: "chime"}, {Key: "x-chime-id"}}
		}, t0.Add(2 * time.Second)},
		{"delay of exactly the horizon", func(ev *chimev1.Event) { ev.Id = "d"; ev.Delay = durationpb.New(10 * 365 * 24 * time.Hour) },
			t0.Add(10 * 365 * 24 * time.Hour)},
		{"zero delay", func(ev *chimev1.Event) { ev.Id = "z"; ev.Delay = durationpb.New(0) }, t0},
		{"deliver_at exactly at the horizon", func(ev *chimev1.Event) {
			ev.Id, ev.Delay, ev.DeliverAt = "a", nil, timestamppb.New(t0.Add(10*365*24*time.Hour))
		}, t0.Add(10 * 365 * 24 * time.Hour)},
		{"deliver_at in the past", func(ev *chimev1.Event) {
			ev.Id, ev.Delay, ev.DeliverAt = "past", nil, timestamppb.New(time.Date(1969, 7, 20, 20, 17, 0, 0, time.UTC))
		}, time.Date(1969, 7, 20, 20, 17, 0, 0, time.UTC)},
		{"empty key, payload and headers", func(ev *chimev1.Event) { ev.Id, ev.Key, ev.Payload, ev.Headers = "e", nil, nil, nil },
			t0.Add(2 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := validEvent()
			tc.edit(ev)
			resp, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
			if err != nil {
				t.Fatalf("Schedule: %v", err)
			}
			if resp.Id != ev.Id || resp.Existing || !resp.Due.AsTime().Equal(tc.due) {
				t.Fatalf("got id %q due %v existing %v, want id %q due %v existing false", resp.Id, resp.Due.AsTime(), resp.Existing, ev.Id, tc.due)
			}
		})
	}
}

func TestScheduleSendsTheRequestAsSent(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	ev := validEvent()
	resp, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Id != "order-42" || resp.Existing || !resp.Due.AsTime().Equal(t0.Add(2*time.Second)) {
		t.Fatalf("response %v", resp)
	}
	calls := e.backend.Calls()
	if len(calls) != 1 || calls[0].Method != "Schedule" || len(calls[0].Reqs) != 1 {
		t.Fatalf("backend calls %+v, want one Schedule of one request", calls)
	}
	got := calls[0].Reqs[0]
	hs := []raftfsm.Header{{Key: "trace", Value: []byte("abc")}, {Key: "trace", Value: []byte("def")}}
	want := shard.Request{
		ID: "order-42", Delay: 2 * time.Second, HasDelay: true, Topic: "orders.reminders",
		Key: []byte("customer-7"), Payload: []byte(`{"remind":true}`), Headers: hs,
		ContentHash: raftfsm.ContentHash("orders.reminders", []byte("customer-7"), []byte(`{"remind":true}`), hs, 0, int64(2*time.Second), false, true, raftfsm.DefaultPolicy, raftfsm.Output{}),
		Policy:      raftfsm.DefaultPolicy,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("backend got\n%+v\nwant\n%+v", got, want)
	}

	at := time.Date(2027, 1, 2, 3, 4, 5, 6, time.UTC)
	ev = validEvent()
	ev.Id, ev.Delay, ev.DeliverAt = "abs", nil, timestamppb.New(at)
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
		t.Fatal(err)
	}
	got = e.backend.Calls()[1].Reqs[0]
	if !got.HasDeliverAt || got.HasDelay || got.DeliverAt != at.UnixNano() ||
		got.ContentHash != raftfsm.ContentHash(ev.Topic, ev.Key, ev.Payload, hs, at.UnixNano(), 0, true, false, raftfsm.DefaultPolicy, raftfsm.Output{}) {
		t.Fatalf("backend got %+v for deliver_at %v", got, at)
	}

	// A priority and a window reach the backend, and are part of the
	// content: the same event with another priority is another request.
	ev.Id, ev.Priority, ev.Window = "policy", proto.Uint32(9), durationpb.New(time.Minute)
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
		t.Fatal(err)
	}
	p := raftfsm.Policy{Priority: 9, Window: int64(time.Minute)}
	got = e.backend.Calls()[2].Reqs[0]
	if got.Policy != p || got.ContentHash != raftfsm.ContentHash(ev.Topic, ev.Key, ev.Payload, hs, at.UnixNano(), 0, true, false, p, raftfsm.Output{}) ||
		got.ContentHash == raftfsm.ContentHash(ev.Topic, ev.Key, ev.Payload, hs, at.UnixNano(), 0, true, false, raftfsm.Policy{Priority: 8, Window: p.Window}, raftfsm.Output{}) {
		t.Fatalf("backend got %+v for priority 9, window 1m", got)
	}
	g, err := e.client.Get(ctx(t), &chimev1.GetRequest{Id: "policy"})
	if err != nil || g.Event.GetPriority() != 9 || g.Event.GetWindow().AsDuration() != time.Minute {
		t.Fatalf("Get(policy) = %v, %v; want priority 9, window 1m", g, err)
	}
	if g.Event.Partition != nil || g.Event.Tombstone {
		t.Fatalf("Get(policy) shows partition %v, tombstone %v; the event has neither", g.Event.Partition, g.Event.Tombstone)
	}

	// A partition (0 is one) and a tombstone reach the backend, are part
	// of the content, and Get shows them.
	ev = validEvent()
	ev.Id, ev.Delay, ev.DeliverAt = "output", nil, timestamppb.New(at)
	ev.Payload, ev.Partition, ev.Tombstone = nil, proto.Int32(0), true
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
		t.Fatal(err)
	}
	o := raftfsm.Output{Partition: 0, HasPartition: true, Tombstone: true}
	calls = e.backend.Calls()
	got = calls[len(calls)-1].Reqs[0]
	hash := func(o raftfsm.Output) uint64 {
		return raftfsm.ContentHash(ev.Topic, ev.Key, nil, hs, at.UnixNano(), 0, true, false, raftfsm.DefaultPolicy, o)
	}
	if got.Output != o || got.ContentHash != hash(o) || got.ContentHash == hash(raftfsm.Output{Tombstone: true}) ||
		got.ContentHash == hash(raftfsm.Output{}) {
		t.Fatalf("backend got %+v for partition 0, tombstone", got)
	}
	g, err = e.client.Get(ctx(t), &chimev1.GetRequest{Id: "output"})
	if err != nil || g.Event.Partition == nil || g.Event.GetPartition() != 0 || !g.Event.GetTombstone() {
		t.Fatalf("Get(output) = %v, %v; want partition 0, tombstone", g, err)
	}
	ev.Partition = proto.Int32(1)
	if _, err = e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("the same event for another partition: %v, want ALREADY_EXISTS", err)
	}
}

func TestScheduleGeneratesAnIDWhenEmpty(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	var ids []string
	for range 2 {
		ev := validEvent()
		ev.Id = ""
		resp, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Id) != 26 || strings.Trim(resp.Id, "abcdefghijklmnopqrstuvwxyz234567") != "" {
			t.Fatalf("generated id %q is not 26 characters of lower-case base32", resp.Id)
		}
		if resp.Existing {
			t.Fatalf("a generated id came back existing")
		}
		ids = append(ids, resp.Id)
	}
	if ids[0] == ids[1] {
		t.Fatalf("two requests without id got the same id %q", ids[0])
	}
	calls := e.backend.Calls()
	if calls[0].Reqs[0].ID != ids[0] || calls[1].Reqs[0].ID != ids[1] {
		t.Fatalf("backend saw ids %q, %q; responses said %q", calls[0].Reqs[0].ID, calls[1].Reqs[0].ID, ids)
	}
}

func TestScheduleIsIdempotentByID(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	first, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: validEvent()})
	if err != nil {
		t.Fatal(err)
	}
	// A retry later, with the same relative delay, is the same event: it
	// gets the original due, not now+delay.
	e.clock.Advance(5 * time.Second)
	again, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: validEvent()})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Existing || again.Id != first.Id || !again.Due.AsTime().Equal(t0.Add(2*time.Second)) {
		t.Fatalf("retry got %v, want existing with id %q due %v", again, first.Id, t0.Add(2*time.Second))
	}

	for name, edit := range map[string]func(*chimev1.Event){
		"payload":                        func(ev *chimev1.Event) { ev.Payload = []byte("other") },
		"header order":                   func(ev *chimev1.Event) { ev.Headers[0], ev.Headers[1] = ev.Headers[1], ev.Headers[0] },
		"delay":                          func(ev *chimev1.Event) { ev.Delay = durationpb.New(3 * time.Second) },
		"deliver_at at the same due":     func(ev *chimev1.Event) { ev.Delay, ev.DeliverAt = nil, timestamppb.New(t0.Add(2*time.Second)) },
		"topic":                          func(ev *chimev1.Event) { ev.Topic = "other" },
		"key":                            func(ev *chimev1.Event) { ev.Key = nil },
		"a header value":                 func(ev *chimev1.Event) { ev.Headers[1].Value = []byte("xyz") },
		"headers dropped":                func(ev *chimev1.Event) { ev.Headers = nil },
		"one header more (not reserved)": func(ev *chimev1.Event) { ev.Headers = append(ev.Headers, &chimev1.Header{Key: "x"}) },
	} {
		t.Run("different "+name, func(t *testing.T) {
			ev := validEvent()
			edit(ev)
			_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
			wantStatus(t, err, codes.AlreadyExists, `event.id: "order-42" already scheduled with different content`)
		})
	}
	rec, found, _ := e.backend.Get(context.Background(), "order-42")
	if !found || string(rec.Payload) != `{"remind":true}` || rec.Due != t0.Add(2*time.Second).UnixNano() {
		t.Fatalf("the stored event changed: %+v", rec)
	}
}

func TestBatchScheduleMixedValidAndInvalid(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	// order-42 exists already, so a different event under its id conflicts.
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: validEvent()}); err != nil {
		t.Fatal(err)
	}
	generated := validEvent()
	generated.Id = ""
	noTopic := validEvent()
	noTopic.Id, noTopic.Topic = "", ""
	abs := validEvent()
	abs.Id, abs.Delay, abs.DeliverAt = "abs", nil, timestamppb.New(t0.Add(time.Hour))
	reserved := validEvent()
	reserved.Id = "res"
	reserved.Headers[1].Key = "chime-attempt"
	conflict := validEvent()
	conflict.Payload = []byte("changed")
	same := validEvent()
	twiceA := validEvent()
	twiceA.Id, twiceA.Delay = "twice", durationpb.New(time.Minute)
	twiceB := validEvent()
	twiceB.Id, twiceB.Delay = "twice", durationpb.New(2*time.Minute)

	resp, err := e.client.BatchSchedule(ctx(t), &chimev1.BatchScheduleRequest{Events: []*chimev1.Event{
		generated, noTopic, abs, reserved, conflict, same, twiceA, twiceB,
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Results
	if len(r) != 8 {
		t.Fatalf("%d results for 8 events", len(r))
	}
	type res struct {
		id       string
		due      time.Time
		existing bool
		code     int32
		msg      string
	}
	got := make([]res, len(r))
	for i, x := range r {
		got[i] = res{x.Id, time.Time{}, x.Existing, x.Code, x.Message}
		if x.Due != nil {
			got[i].due = x.Due.AsTime()
		}
	}
	if len(got[0].id) != 26 {
		t.Fatalf("results[0].id = %q, want a generated id", got[0].id)
	}
	want := []res{
		{got[0].id, t0.Add(2 * time.Second), false, 0, ""},
		{"", time.Time{}, false, 3, "events[1].topic: required"},
		{"abs", t0.Add(time.Hour), false, 0, ""},
		{"res", time.Time{}, false, 3, `events[3].headers[1].key: the "chime-" prefix is reserved for headers Chime adds`},
		{"order-42", time.Time{}, false, 6, `events[4].id: "order-42" already scheduled with different content`},
		{"order-42", t0.Add(2 * time.Second), true, 0, ""},
		{"twice", t0.Add(time.Minute), false, 0, ""},
		{"twice", time.Time{}, false, 6, `events[7].id: "twice" already scheduled with different content`},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("results[%d] = %+v\nwant         %+v", i, got[i], want[i])
		}
	}
	calls := e.backend.Calls()
	if len(calls) != 2 {
		t.Fatalf("backend saw %d calls, want the Schedule before and one for the batch", len(calls))
	}
	var ids []string
	for _, q := range calls[1].Reqs {
		ids = append(ids, q.ID)
	}
	if !slices.Equal(ids, []string{got[0].id, "abs", "order-42", "order-42", "twice", "twice"}) {
		t.Fatalf("backend got ids %q: want only the valid events, in order", ids)
	}
}

func TestBatchScheduleRejectsTheCallOnlyWhenItCannotBeHandled(t *testing.T) {
	e := start(t, rpc.Limits{MaxBatch: 3}, nil)
	_, err := e.client.BatchSchedule(ctx(t), &chimev1.BatchScheduleRequest{})
	wantStatus(t, err, codes.InvalidArgument, "events: required (at least one event)")
	_, err = e.client.BatchSchedule(ctx(t), &chimev1.BatchScheduleRequest{Events: []*chimev1.Event{validEvent(), validEvent(), validEvent(), validEvent()}})
	wantStatus(t, err, codes.InvalidArgument, "events: 4 events, at most 3 allowed")

	// Every rule reports under the event's own path; an all-invalid batch is
	// still answered, and nothing reaches the backend.
	cases := invalidCases()
	for i := 0; i < len(cases); i += 3 {
		var evs []*chimev1.Event
		var want []string
		for j := i; j < i+3 && j < len(cases); j++ {
			evs = append(evs, cases[j].edit(validEvent()))
			want = append(want, fmt.Sprintf("events[%d]%s", j-i, cases[j].msg))
		}
		resp, err := e.client.BatchSchedule(ctx(t), &chimev1.BatchScheduleRequest{Events: evs})
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range resp.Results {
			if r.Code != int32(codes.InvalidArgument) || r.Message != want[k] || r.Due != nil {
				t.Errorf("result %d: code %d %q due %v; want code 3 %q", k, r.Code, r.Message, r.Due, want[k])
			}
		}
	}
	if calls := e.backend.Calls(); len(calls) != 0 {
		t.Fatalf("the backend saw %d calls for invalid batches", len(calls))
	}
	// A topic found valid once is not checked again in the batch; one found
	// reserved is refused every time.
	reserved := func() *chimev1.Event { ev := validEvent(); ev.Topic = "__consumer_offsets"; return ev }
	for _, evs := range [][]*chimev1.Event{{reserved(), reserved()}, {validEvent(), reserved(), reserved()}} {
		resp, err := e.client.BatchSchedule(ctx(t), &chimev1.BatchScheduleRequest{Events: evs})
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range resp.Results {
			if reservedTopic := evs[k].Topic == "__consumer_offsets"; reservedTopic != (r.Code == int32(codes.InvalidArgument)) {
				t.Errorf("events[%d] (topic %q): code %d %q", k, evs[k].Topic, r.Code, r.Message)
			}
		}
	}

	e.backend.FailWith(shard.ErrNotLeader)
	_, err = e.client.BatchSchedule(ctx(t), &chimev1.BatchScheduleRequest{Events: []*chimev1.Event{validEvent()}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("batch with a failing backend: %v, want Unavailable", err)
	}
}

func TestCancel(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	for _, id := range []string{"pending", "fired", "dead"} {
		ev := validEvent()
		ev.Id = id
		if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	firedAt := t0.Add(2*time.Second + 3*time.Millisecond)
	e.backend.Fire("fired", firedAt, 1)
	e.backend.DeadLetter("dead", firedAt, 5, "kafka: message too large", "chime.dlq")
	before := len(e.backend.Calls())

	_, err := e.client.Cancel(ctx(t), &chimev1.CancelRequest{})
	wantStatus(t, err, codes.InvalidArgument, "id: required")
	_, err = e.client.Cancel(ctx(t), &chimev1.CancelRequest{Id: strings.Repeat("x", 257)})
	wantStatus(t, err, codes.InvalidArgument, "id: 257 bytes, at most 256 allowed")
	if n := len(e.backend.Calls()); n != before {
		t.Fatalf("invalid cancels reached the backend")
	}

	_, err = e.client.Cancel(ctx(t), &chimev1.CancelRequest{Id: "nope"})
	wantStatus(t, err, codes.NotFound, `id: no event "nope" (never scheduled, or settled longer ago than the cluster's retention and removed)`)

	for range 2 { // cancelling twice answers the same
		resp, err := e.client.Cancel(ctx(t), &chimev1.CancelRequest{Id: "pending"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Id != "pending" || resp.State != chimev1.EventState_EVENT_STATE_CANCELLED {
			t.Fatalf("cancel response %v", resp)
		}
	}
	_, err = e.client.Cancel(ctx(t), &chimev1.CancelRequest{Id: "fired"})
	wantStatus(t, err, codes.FailedPrecondition, `id: event "fired" already fired at 2026-03-01T12:00:02.003Z; it can no longer be cancelled`)
	_, err = e.client.Cancel(ctx(t), &chimev1.CancelRequest{Id: "dead"})
	wantStatus(t, err, codes.FailedPrecondition, `id: event "dead" was already dead-lettered to "chime.dlq" at 2026-03-01T12:00:02.003Z; it can no longer be cancelled`)
}

func TestGet(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	for _, id := range []string{"pending", "fired", "cancelled", "dead"} {
		ev := validEvent()
		ev.Id = id
		if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Second)
	cancelledAt := e.clock.Now()
	if _, err := e.client.Cancel(ctx(t), &chimev1.CancelRequest{Id: "cancelled"}); err != nil {
		t.Fatal(err)
	}
	firedAt := t0.Add(2*time.Second + 7*time.Millisecond)
	e.backend.Fire("fired", firedAt, 2)
	e.backend.DeadLetter("dead", firedAt, 5, "kafka: message too large", "chime.dlq")

	_, err := e.client.Get(ctx(t), &chimev1.GetRequest{})
	wantStatus(t, err, codes.InvalidArgument, "id: required")
	_, err = e.client.Get(ctx(t), &chimev1.GetRequest{Id: "nope"})
	wantStatus(t, err, codes.NotFound, `id: no event "nope" (never scheduled, or settled longer ago than the cluster's retention and removed)`)

	due := timestamppb.New(t0.Add(2 * time.Second))
	event := func(id string) *chimev1.Event {
		ev := validEvent()
		ev.Id, ev.Delay, ev.DeliverAt = id, nil, due
		ev.Priority = proto.Uint32(raftfsm.DefaultPriority) // Get shows it, set or not
		return ev
	}
	for _, want := range []*chimev1.GetResponse{
		{Event: event("pending"), State: chimev1.EventState_EVENT_STATE_SCHEDULED, Due: due, CreatedAt: timestamppb.New(t0), Version: 1},
		{Event: event("fired"), State: chimev1.EventState_EVENT_STATE_FIRED, Due: due, CreatedAt: timestamppb.New(t0),
			FiredAt: timestamppb.New(firedAt), Attempts: 2, Version: 1},
		{Event: event("cancelled"), State: chimev1.EventState_EVENT_STATE_CANCELLED, Due: due, CreatedAt: timestamppb.New(t0),
			CancelledAt: timestamppb.New(cancelledAt), Version: 1},
		{Event: event("dead"), State: chimev1.EventState_EVENT_STATE_DEAD_LETTERED, Due: due, CreatedAt: timestamppb.New(t0),
			FiredAt: timestamppb.New(firedAt), Attempts: 5, LastError: "kafka: message too large", DeadLetterTopic: "chime.dlq", Version: 1},
	} {
		got, err := e.client.Get(ctx(t), &chimev1.GetRequest{Id: want.Event.Id})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("Get(%q) =\n%v\nwant\n%v", want.Event.Id, got, want)
		}
	}
}

func TestBackendErrorsMapToCodes(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	for _, tc := range []struct {
		err    error
		code   codes.Code
		logged bool
	}{
		{shard.ErrNotLeader, codes.Unavailable, false},
		{fmt.Errorf("shard 3: %w", shard.ErrStopped), codes.Unavailable, false},
		{shard.ErrUnknownShard, codes.Unavailable, false},
		{fmt.Errorf("propose: %w", context.DeadlineExceeded), codes.DeadlineExceeded, false},
		{context.Canceled, codes.Canceled, false},
		{status.Error(codes.ResourceExhausted, "forwarded: too many requests"), codes.ResourceExhausted, false},
		{shard.ErrFiring, codes.Aborted, false},
		{shard.ErrChanging, codes.Aborted, false},
		{fmt.Errorf("%w (leadership lost)", shard.ErrChangeUnknown), codes.Unknown, false},
		{errors.New("pebble: disk on fire"), codes.Internal, true},
	} {
		e.backend.FailWith(tc.err)
		calls := []func() error{
			func() error {
				_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: validEvent()})
				return err
			},
			func() error { _, err := e.client.Cancel(ctx(t), &chimev1.CancelRequest{Id: "x"}); return err },
			func() error { _, err := e.client.Get(ctx(t), &chimev1.GetRequest{Id: "x"}); return err },
			func() error {
				_, err := e.client.Update(ctx(t), &chimev1.UpdateRequest{Id: "x", Delay: durationpb.New(time.Second)})
				return err
			},
		}
		for i, call := range calls {
			err := call()
			if status.Code(err) != tc.code {
				t.Errorf("backend error %v, call %d: got %v, want %v", tc.err, i, err, tc.code)
			}
			if tc.code == codes.Unavailable && !strings.Contains(status.Convert(err).Message(), "retry") {
				t.Errorf("Unavailable without a retry hint: %v", err)
			}
		}
		if logged := strings.Contains(e.log.String(), tc.err.Error()); logged != tc.logged {
			t.Errorf("backend error %v: logged = %v, want %v\nlog: %s", tc.err, logged, tc.logged, e.log.String())
		}
	}
}

// deadlineBackend records the deadline of the context each call gets.
type deadlineBackend struct {
	*rpctest.Backend
	mu        sync.Mutex
	deadlines []time.Time
}

func (d *deadlineBackend) Schedule(ctx context.Context, reqs []shard.Request) ([]shard.Result, error) {
	dl, _ := ctx.Deadline()
	d.mu.Lock()
	d.deadlines = append(d.deadlines, dl)
	d.mu.Unlock()
	return d.Backend.Schedule(ctx, reqs)
}

func TestTheRequestContextReachesTheBackend(t *testing.T) {
	d := &deadlineBackend{Backend: rpctest.New(nil)}
	e := start(t, rpc.Limits{}, d)
	c, cancel := context.WithTimeout(context.Background(), 42*time.Second)
	defer cancel()
	want, _ := c.Deadline()
	if _, err := e.client.Schedule(c, &chimev1.ScheduleRequest{Event: validEvent()}); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.deadlines) != 1 || d.deadlines[0].IsZero() || d.deadlines[0].Sub(want).Abs() > time.Second {
		t.Fatalf("backend saw deadlines %v, want about %v", d.deadlines, want)
	}
}

// wrongCountBackend answers Schedule with no results at all.
type wrongCountBackend struct{ *rpctest.Backend }

func (wrongCountBackend) Schedule(context.Context, []shard.Request) ([]shard.Result, error) {
	return nil, nil
}

func TestABackendThatBreaksItsContractIsInternal(t *testing.T) {
	e := start(t, rpc.Limits{}, wrongCountBackend{rpctest.New(nil)})
	_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: validEvent()})
	wantStatus(t, err, codes.Internal, "Schedule: internal error: backend returned 0 results for 1 request")
	if !strings.Contains(e.log.String(), "backend returned 0 results") {
		t.Fatalf("not logged: %s", e.log.String())
	}
}

func TestReflectionListsTheScheduler(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	stream, err := rpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !slices.Contains(names, "chime.v1.Scheduler") {
		t.Fatalf("reflection lists %q, want chime.v1.Scheduler among them", names)
	}

	// grpcurl also needs the file descriptors to build requests.
	if err := stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "chime.v1.Scheduler",
	}}); err != nil {
		t.Fatal(err)
	}
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if fds := resp.GetFileDescriptorResponse().GetFileDescriptorProto(); len(fds) == 0 {
		t.Fatalf("no file descriptor for chime.v1.Scheduler: %v", resp)
	}
}

func TestAllowTopicLetsAReservedTopicThrough(t *testing.T) {
	e := start(t, rpc.Limits{ReservedTopics: []string{"my.dlq"}, AllowTopics: []string{"__audit"}}, nil)
	for topic, ok := range map[string]bool{"__audit": true, "__consumer_offsets": false, "my.dlq": false, "chime.deadletter": true} {
		ev := validEvent()
		ev.Id, ev.Topic = "to-"+topic, topic
		_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
		if (err == nil) != ok {
			t.Errorf("topic %s: %v, want accepted %v", topic, err, ok)
		}
	}
}

// TestDefaultReservedTopics: by default no event may target Kafka's
// internal topics, the Schema Registry's, Kafka Connect's or Chime's own,
// each refusal saying which rule; other names pass.
func TestDefaultReservedTopics(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	// An operator's own pattern says so.
	custom := start(t, rpc.Limits{ReservedTopics: []string{"legacy.*"}}, nil)
	ev := validEvent()
	ev.Topic = "legacy.orders"
	if _, err := custom.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); !strings.Contains(fmt.Sprint(err), `it matches the reserved pattern "legacy.*"`) {
		t.Errorf("an operator's pattern: %v", err)
	}
	for topic, want := range map[string]string{
		"__consumer_offsets": `names starting with "__" are Kafka's internal topics`,
		"_schemas":           `it is the Schema Registry's topic`,
		"connect-configs":    `names starting with "connect-" are Kafka Connect's topics`,
		"chime.audit":        `names starting with "chime." are Chime's own topics`,
		"chime.deadletter":   `it is one of Chime's own topics`,
		"orders":             "",
		"chime-bench":        "",
		"schemas":            "",
	} {
		ev := validEvent()
		ev.Id, ev.Topic = "to-"+topic, topic
		_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v", topic, err)
			}
			continue
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want INVALID_ARGUMENT saying %q", topic, err, want)
		}
	}
}

// TestIngestContext: only a call the ingest path makes in process may carry
// the headers that path adds, and its dry run validates without scheduling.
func TestIngestContext(t *testing.T) {
	b := rpctest.New(func() time.Time { return t0 })
	srv := rpc.NewServer(b, rpc.Limits{}, func() time.Time { return t0 }, slog.New(slog.DiscardHandler))
	withSource := func(id string) *chimev1.Event {
		ev := validEvent()
		ev.Id = id
		ev.Headers = append(ev.Headers, &chimev1.Header{Key: chimev1.HeaderSource, Value: []byte("chime.schedule/0/7")})
		return ev
	}
	batch := func(ctx context.Context, evs ...*chimev1.Event) []*chimev1.ScheduleResult {
		t.Helper()
		resp, err := srv.BatchSchedule(ctx, &chimev1.BatchScheduleRequest{Events: evs})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetResults()
	}

	r := batch(context.Background(), withSource("a"))
	if r[0].GetCode() != int32(codes.InvalidArgument) || !strings.Contains(r[0].GetMessage(), `the "chime-" prefix is reserved`) {
		t.Errorf("chime-source from a caller that is not the ingest path: %+v, want INVALID_ARGUMENT", r[0])
	}
	r = batch(rpc.IngestContext(context.Background(), false), withSource("b"))
	if r[0].GetCode() != 0 {
		t.Errorf("chime-source from the ingest path: %+v, want it scheduled", r[0])
	}
	if len(b.Calls()) != 1 {
		t.Fatalf("backend calls %v, want the one schedule", b.Calls())
	}

	bad := validEvent()
	bad.Id, bad.Topic = "c", ""
	r = batch(rpc.IngestContext(context.Background(), true), withSource("d"), bad)
	if r[0].GetCode() != 0 || r[0].GetId() != "d" || r[1].GetCode() != int32(codes.InvalidArgument) {
		t.Errorf("dry run: %+v, want d valid and c invalid", r)
	}
	if len(b.Calls()) != 1 {
		t.Errorf("a dry run reached the backend: %v", b.Calls())
	}
}
