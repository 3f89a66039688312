package raftfsm

import (
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/raft"
)

// sampleCommands has one of each command, with every field set, plus edge values.
func sampleCommands() []Command {
	return []Command{
		&ScheduleBatch{ProposedAt: 1_700_000_000_123_456_789, Events: []NewEvent{
			{
				ID: "order-42", Due: 1_700_000_060_000_000_000, Topic: "payments.retry",
				Key: []byte("cust-7"), Payload: []byte(`{"amount":1200}`),
				Headers:     []Header{{Key: "trace", Value: []byte{0, 1, 2}}, {Key: "empty"}},
				ContentHash: 0xdeadbeefcafef00d,
			},
			{ID: "", Due: -5, Topic: "", ContentHash: 0},
			{ID: strings.Repeat("x", 300), Due: 1<<63 - 1, Topic: "t", Payload: make([]byte, 1000), ContentHash: 1<<64 - 1},
		}},
		&ScheduleBatch{ProposedAt: 3, Events: []NewEvent{
			{ID: "p9", Due: 7, Topic: "t", Policy: Policy{Priority: MaxPriority}},
			{ID: "w", Due: 7, Topic: "t", Policy: Policy{Priority: DefaultPriority, Window: MaxWindow}},
			{ID: "both", Due: 7, Topic: "t", Replace: true, CheckPending: true, Pending: 4, Policy: Policy{Priority: 0, Window: 1}},
			{ID: "default", Due: 7, Topic: "t", Policy: DefaultPolicy},
			{ID: "out", Due: 7, Topic: "t", Policy: DefaultPolicy, Output: Output{Partition: 1, HasPartition: true, Tombstone: true}},
			{ID: "p0", Due: 7, Topic: "t", Policy: DefaultPolicy, Output: Output{HasPartition: true}},
		}},
		&ScheduleBatch{ProposedAt: -1},
		&Cancel{ProposedAt: 99, IDs: []string{"a", "", "order-42"}},
		&Cancel{},
		&MarkFired{ProposedAt: 5, Entries: []Fired{{Seq: 1, FiredAt: 10, Attempts: 1}, {Seq: 1<<64 - 1, FiredAt: -1 << 63, Attempts: 1<<32 - 1}}},
		&MarkFired{ProposedAt: 7, DueKnown: true, Entries: []Fired{{Seq: 2, FiredAt: 12, Attempts: 1, Due: -1 << 63}, {Seq: 9, Due: 1<<63 - 1}}},
		&MarkFired{DueKnown: true},
		&MarkDeadLettered{ProposedAt: 6, Entries: []DeadLettered{{Seq: 3, At: 11, Attempts: 5, Error: "kafka: leader not available", Topic: "chime-dlq"}, {}}},
		&MarkDeadLettered{ProposedAt: 8, DueKnown: true, Entries: []DeadLettered{{Seq: 4, At: 13, Attempts: 2, Error: "x", Topic: "dlq", Due: -1 << 63}, {Due: 1<<63 - 1}}},
		&Recurring{Op: RecurringCreate, ProposedAt: 1_700_000_000_123_456_789, ID: "nightly", Hash: 0xfeed, Def: Definition{
			Cron: "0 30 2 * * *", TimeZone: "Europe/Paris", Start: 1, End: 1 << 62, Jitter: 5e9, MaxOccurrences: 10,
			CatchUp: CatchUpAll, MaxCatchUp: 1000, Topic: "reports", Key: []byte("k"), Payload: []byte("p"),
			Headers: []Header{{Key: "h", Value: []byte("v")}}}},
		&Recurring{Op: RecurringUpdate, ID: "r", IfVersion: 3, CheckPending: true, Pending: 1 << 40, Def: Definition{Every: 1e9, CatchUp: CatchUpSkip}},
		&Recurring{Op: RecurringDelete, ID: "r", IfVersion: 1},
		&Recurring{Op: RecurringPause, ID: "r", CheckPending: true},
		&Recurring{Op: RecurringPause, ID: "r", CheckPending: true, Pending: 7, IfHash: 1<<64 - 1},
		&Recurring{Op: RecurringDelete, ID: "r", IfVersion: 2, IfHash: 0xfeed},
		&Recurring{Op: RecurringResume, ProposedAt: -1, ID: "r"},
		&Recurring{Op: RecurringTrigger, ProposedAt: 5, ID: "r", At: 1_700_000_000_123_000_000},
		&Recurring{Op: RecurringTrigger, ID: "r", IfHash: 9, At: -1},
		&Recurring{Op: RecurringBackfill, ProposedAt: 5, ID: "r", From: -1 << 63, To: 1<<63 - 1, Limit: 1000, LimitBytes: 64 << 20},
		&Recurring{Op: RecurringBackfill, ID: "r", IfHash: 1, From: 1, To: 2},
	}
}

func TestCommandRoundTrip(t *testing.T) {
	cmds := sampleCommands()
	g := newGen(1)
	m := newModel()
	for range 200 {
		c := g.command(m)
		cmds = append(cmds, c)
		m.apply(&raft.Log{}, c) // advance the model so later marks name real seqs
	}
	for _, c := range cmds {
		data := encode(c)
		if CommandType(data[0]) != c.Type() {
			t.Fatalf("%T encodes with type byte %d, Type() says %d", c, data[0], c.Type())
		}
		got, err := DecodeCommand(data)
		if err != nil {
			t.Fatalf("decode %+v: %v", c, err)
		}
		if !reflect.DeepEqual(got, normalize(c)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, c)
		}
		// Every strict prefix is malformed, never silently accepted as a shorter command.
		for n := range len(data) {
			if _, err := DecodeCommand(data[:n]); err == nil {
				t.Fatalf("%T: prefix of %d/%d bytes decoded without error", c, n, len(data))
			}
		}
		if _, err := DecodeCommand(append(data, 0)); err == nil {
			t.Fatalf("%T: trailing byte accepted", c)
		}
	}
}

// normalize returns c as DecodeCommand yields it: empty byte slices and lists become nil.
func normalize(c Command) Command {
	nb := func(b []byte) []byte {
		if len(b) == 0 {
			return nil
		}
		return b
	}
	switch c := c.(type) {
	case *ScheduleBatch:
		out := *c
		out.Events = nil
		for _, e := range c.Events {
			e.Key, e.Payload = nb(e.Key), nb(e.Payload)
			var hs []Header
			for _, h := range e.Headers {
				hs = append(hs, Header{Key: h.Key, Value: nb(h.Value)})
			}
			e.Headers = hs
			out.Events = append(out.Events, e)
		}
		return &out
	}
	return c
}

func TestDecodeCommandErrors(t *testing.T) {
	valid := AppendScheduleBatch(nil, &ScheduleBatch{ProposedAt: 1, Events: []NewEvent{{ID: "a", Topic: "t", Payload: []byte("p")}}})
	// An event whose encoding ends in its priority byte, and one whose ends in its window.
	priority10 := AppendScheduleBatch(nil, &ScheduleBatch{Events: []NewEvent{{ID: "a", Policy: Policy{Priority: MaxPriority}}}})
	priority10[len(priority10)-1] = MaxPriority + 1
	window0 := AppendScheduleBatch(nil, &ScheduleBatch{Events: []NewEvent{{ID: "a", Policy: Policy{Priority: DefaultPriority, Window: 1}}}})
	window0[len(window0)-1] = 0
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "empty entry"},
		{"zero type", []byte{0}, "unknown command type 0"},
		{"unknown type", []byte{99, 0, 0}, "unknown command type 99"},
		{"huge count", []byte{byte(TypeCancel), 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, "ids: count"},
		{"truncated", valid[:len(valid)-3], "events[0].contentHash"},
		{"priority above 9", priority10, "events[0].priority: priority 10 above 9"},
		{"zero window", window0, "events[0].window: window 0 not in"},
		{"attempts overflow", []byte{byte(TypeMarkFired), 0, 1, 1, 0, 0x80, 0x80, 0x80, 0x80, 0x10}, "entries[0].attempts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeCommand(tc.data)
			if !errors.Is(err, ErrMalformedCommand) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeCommand(%x) = %v, want ErrMalformedCommand naming %q", tc.data, err, tc.want)
			}
		})
	}
}

// FuzzDecodeCommand: DecodeCommand never panics, and whatever it accepts re-encodes to bytes
// that decode to the same command (the decoder and the encoders agree on one format).
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range sampleCommands() {
		f.Add(encode(c))
	}
	f.Add([]byte{})
	f.Add([]byte{byte(TypeScheduleBatch), 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeCommand(data)
		if err != nil {
			if !errors.Is(err, ErrMalformedCommand) {
				t.Fatalf("error does not wrap ErrMalformedCommand: %v", err)
			}
			return
		}
		again, err := DecodeCommand(encode(c))
		if err != nil {
			t.Fatalf("re-encoding of an accepted command does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, c) {
			t.Fatalf("decode(encode(c)) != c:\n got %+v\nwant %+v", again, c)
		}
	})
}

func TestContentHash(t *testing.T) {
	type req struct {
		topic                string
		key, payload         []byte
		headers              []Header
		deliverAt, delay     int64
		haveDeliver, haveDly bool
	}
	h := func(r req) uint64 {
		return ContentHash(r.topic, r.key, r.payload, r.headers, r.deliverAt, r.delay, r.haveDeliver, r.haveDly, DefaultPolicy, Output{})
	}
	base := req{topic: "t", key: []byte("k"), payload: []byte("p"), headers: []Header{{"a", []byte("1")}}, delay: 5e9, haveDly: true}
	if first, second := h(base), h(base); first != second {
		t.Fatal("not deterministic")
	}
	// Pinned: the hash is a stored format (ContentHash doc). If this changes, every stored
	// event answers a re-send with Conflict after the upgrade.
	spelled := []byte("chime/content/v1\x00" + "\x01t" + "\x01k" + "\x01p" + "\x01" + "\x01a\x011" + "\x02")
	spelled = binary.BigEndian.AppendUint64(spelled, 5e9)
	if got, want := h(base), xxhash.Sum64(spelled); got != want || got != 0x5c271cb3be1c1b1f {
		t.Fatalf("ContentHash(base) = %#x, want %#x (= 0x5c271cb3be1c1b1f): the stored format changed", got, want)
	}
	// Each variation, including moving bytes across field boundaries, must change the hash.
	variants := map[string]req{
		"topic":             {topic: "u", key: base.key, payload: base.payload, headers: base.headers, delay: base.delay, haveDly: true},
		"topic/key shift":   {topic: "tk", payload: base.payload, headers: base.headers, delay: base.delay, haveDly: true},
		"key/payload move":  {topic: "t", key: []byte("kp"), headers: base.headers, delay: base.delay, haveDly: true},
		"payload":           {topic: "t", key: base.key, payload: []byte("q"), headers: base.headers, delay: base.delay, haveDly: true},
		"no headers":        {topic: "t", key: base.key, payload: base.payload, delay: base.delay, haveDly: true},
		"header value":      {topic: "t", key: base.key, payload: base.payload, headers: []Header{{"a", []byte("2")}}, delay: base.delay, haveDly: true},
		"header split":      {topic: "t", key: base.key, payload: base.payload, headers: []Header{{"a1", nil}}, delay: base.delay, haveDly: true},
		"two headers":       {topic: "t", key: base.key, payload: base.payload, headers: []Header{{"a", []byte("1")}, {"", nil}}, delay: base.delay, haveDly: true},
		"delay":             {topic: "t", key: base.key, payload: base.payload, headers: base.headers, delay: 6e9, haveDly: true},
		"deliverAt instead": {topic: "t", key: base.key, payload: base.payload, headers: base.headers, deliverAt: 5e9, haveDeliver: true},
		"neither":           {topic: "t", key: base.key, payload: base.payload, headers: base.headers},
	}
	seen := map[uint64]string{h(base): "base"}
	for name, r := range variants {
		if other, dup := seen[h(r)]; dup {
			t.Errorf("%q hashes like %q", name, other)
		}
		seen[h(r)] = name
	}
	// Values whose have-flag is false are ignored; nil and empty are the same on the wire.
	ignored := base
	ignored.deliverAt = 123
	if h(ignored) != h(base) {
		t.Error("deliverAt changed the hash although haveDeliverAt is false")
	}
	empty := req{topic: "t", key: []byte{}, payload: []byte{}}
	if h(empty) != h(req{topic: "t"}) {
		t.Error("empty and nil byte slices hash differently")
	}
}
