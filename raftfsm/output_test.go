package raftfsm

import (
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// goldenEvents are events without an Output, in every body format the version before wrote:
// the default policy, a priority and a window, and a policy whose priority is 0.
func goldenEvents() []NewEvent {
	return []NewEvent{
		{ID: "order-42", Topic: "payments.retry", Key: []byte("cust-7"), Payload: []byte(`{"amount":1200}`),
			Headers: []Header{{Key: "trace", Value: []byte{0, 1, 2}}, {Key: "empty"}}, ContentHash: 0xdeadbeefcafef00d, Policy: DefaultPolicy},
		{ID: "e", Topic: "t", ContentHash: 1, Policy: DefaultPolicy},
		{ID: "p9", Topic: "t", Payload: []byte("x"), ContentHash: 2, Policy: Policy{Priority: 9, Window: 1_000_000_000}},
		{ID: "p0", Topic: "t", ContentHash: 3, Policy: Policy{Priority: 0}},
	}
}

// TestBodyWithoutOutputIsUnchanged: an event without an Output (every event stored before
// events had one, and the common case since) is stored byte for byte as the version before
// stored it. The bytes were written by that version's appendBody (format 1 for a first
// version, 2 for a later one, 3 with a policy).
func TestBodyWithoutOutputIsUnchanged(t *testing.T) {
	const createdAt = 1_700_000_000_123_456_789
	golden := map[[2]int]string{
		{0, 1}: "01086f726465722d3432aab4aed8c7bfce972f0e7061796d656e74732e726574727906637573742d370f7b22616d6f756e74223a313230307d020574726163650300010205656d707479000df0fecaefbeadde",
		{0, 3}: "02086f726465722d3432aab4aed8c7bfce972f0e7061796d656e74732e726574727906637573742d370f7b22616d6f756e74223a313230307d020574726163650300010205656d707479000df0fecaefbeadde03",
		{1, 1}: "010165aab4aed8c7bfce972f01740000000100000000000000",
		{1, 3}: "020165aab4aed8c7bfce972f0174000000010000000000000003",
		{2, 1}: "03027039aab4aed8c7bfce972f017400017800020000000000000001098094ebdc03",
		{2, 3}: "03027039aab4aed8c7bfce972f017400017800020000000000000003098094ebdc03",
		{3, 1}: "03027030aab4aed8c7bfce972f01740000000300000000000000010000",
		{3, 3}: "03027030aab4aed8c7bfce972f01740000000300000000000000030000",
	}
	for i, e := range goldenEvents() {
		for _, v := range []int{1, 3} {
			got := hex.EncodeToString(appendBody(nil, &e, createdAt, uint64(v)))
			if want := golden[[2]int{i, v}]; got != want {
				t.Errorf("body of event %d, version %d:\n got %s\nwant %s (as the version before wrote it)", i, v, got, want)
			}
		}
	}
}

// TestScheduleBatchWithoutOutputIsUnchanged: a ScheduleBatch whose events have no Output
// encodes byte for byte as the version before encoded it, as TypeScheduleBatch without any
// flag, as TypeScheduleBatchFlags with them; and its content hash is the one it computed.
func TestScheduleBatchWithoutOutputIsUnchanged(t *testing.T) {
	evs := goldenEvents()
	for i := range evs {
		evs[i].Due = 1_700_000_060_000_000_000 + int64(i)
	}
	plain := &ScheduleBatch{ProposedAt: 5, Events: evs[:2]}
	flagged := []NewEvent{evs[0], evs[2], evs[3]}
	flagged[0].Replace, flagged[0].CheckPending, flagged[0].Pending = true, true, 77
	for _, tc := range []struct {
		name string
		c    *ScheduleBatch
		want string
	}{
		{"plain", plain, "010a02086f726465722d343280e08ae785c3ce972f0e7061796d656e74732e726574727906637573742d370f7b22616d6f756e74223a313230307d020574726163650300010205656d707479000df0fecaefbeadde016582e08ae785c3ce972f01740000000100000000000000"},
		{"flagged", &ScheduleBatch{ProposedAt: -5, Events: flagged}, "080903086f726465722d343280e08ae785c3ce972f0e7061796d656e74732e726574727906637573742d370f7b22616d6f756e74223a313230307d020574726163650300010205656d707479000df0fecaefbeadde034d02703984e08ae785c3ce972f01740001780002000000000000000c098094ebdc0302703086e08ae785c3ce972f017400000003000000000000000400"},
	} {
		if got := hex.EncodeToString(AppendScheduleBatch(nil, tc.c)); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s (as the version before encoded it)", tc.name, got, tc.want)
		}
	}
	const want = 0x9b1d91da600def89
	if got := ContentHash("t", []byte("k"), []byte("p"), nil, 0, 5e9, false, true, Policy{Priority: 9, Window: 7}, Output{}); got != want {
		t.Errorf("ContentHash with a policy and no output = %#x, want %#x (the version before's)", got, uint64(want))
	}
}

// outputEvents are events with each kind of Output, over each policy and version.
func outputEvents() []NewEvent {
	var out []NewEvent
	for _, o := range []Output{
		{HasPartition: true},
		{Partition: 3, HasPartition: true},
		{Partition: math.MaxInt32, HasPartition: true},
		{Tombstone: true},
		{Partition: 2, HasPartition: true, Tombstone: true},
	} {
		for _, p := range []Policy{DefaultPolicy, {Priority: 0}, {Priority: 9, Window: MaxWindow}} {
			e := NewEvent{ID: "o", Topic: "compacted", Key: []byte("k"), ContentHash: 9, Policy: p, Output: o}
			if !o.Tombstone {
				e.Payload = []byte("v")
			}
			out = append(out, e)
		}
	}
	return out
}

// TestBodyOutputRoundTrip: an event's Output survives its body (format 4), with every
// policy and version; checkBody accepts what decodeBody does; an event without one decodes
// with the zero Output.
func TestBodyOutputRoundTrip(t *testing.T) {
	for _, e := range append(outputEvents(), goldenEvents()...) {
		for _, version := range []uint64{1, 2, 1 << 40} {
			b := appendBody(nil, &e, 77, version)
			if withOutput := e.Output != (Output{}); (b[0] == formatV4) != withOutput {
				t.Fatalf("event %+v: body format %d", e, b[0])
			}
			got, err := decodeBody(b)
			if err != nil {
				t.Fatalf("event %+v, version %d: %v", e, version, err)
			}
			if cerr := checkBody(b); cerr != nil {
				t.Fatalf("checkBody refuses what decodeBody takes: %v", cerr)
			}
			want := e
			if len(want.Payload) == 0 {
				want.Payload = nil
			}
			if !reflect.DeepEqual(got.NewEvent, want) || got.version != version || got.createdAt != 77 {
				t.Fatalf("round trip of %+v, version %d:\n got %+v (version %d)", e, version, got, got.version)
			}
		}
	}
	b := appendBody(nil, &outputEvents()[len(outputEvents())-1], 1, 2)
	if n := testing.AllocsPerRun(100, func() { _ = checkBody(b) }); n != 0 {
		t.Errorf("checkBody of a format 4 body allocates %v times; Restore checks every body with it", n)
	}
}

// TestDecodeBodyOutputErrors: a format 4 body without an output flag, with an unknown one,
// or with a partition past int32 is corrupt, to decodeBody and checkBody alike.
func TestDecodeBodyOutputErrors(t *testing.T) {
	e := NewEvent{ID: "o", Topic: "t", Policy: DefaultPolicy, Output: Output{Tombstone: true}}
	tomb := appendBody(nil, &e, 1, 1) // ends in the flags byte
	noFlag := append([]byte(nil), tomb...)
	noFlag[len(noFlag)-1] = 0
	unknown := append([]byte(nil), tomb...)
	unknown[len(unknown)-1] |= 1 << 5
	e.Output = Output{Partition: math.MaxInt32, HasPartition: true}
	big := appendBody(nil, &e, 1, 1)                             // ends in the partition's uvarint: 5 bytes
	big = append(big[:len(big)-5], 0x80, 0x80, 0x80, 0x80, 0x08) // 1<<31
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"no flag":         {noFlag, "no output flag"},
		"unknown flag":    {unknown, "unknown output flags 0x20"},
		"partition > max": {big, "partition 2147483648 above 2147483647"},
		"truncated":       {tomb[:len(tomb)-1], "output: missing"},
	} {
		_, err := decodeBody(tc.b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: decodeBody = %v, want an error naming %q", name, err, tc.want)
		}
		if cerr := checkBody(tc.b); cerr == nil || err == nil || cerr.Error() != err.Error() {
			t.Errorf("%s: checkBody = %v, decodeBody %v", name, cerr, err)
		}
	}
}

// TestScheduleBatchOutputRoundTrip: a ScheduleBatch whose events have an Output is
// TypeScheduleBatchFlags and decodes to the same events; one Output among default events
// flags the whole batch; a partition past int32 or an unknown flag does not decode.
func TestScheduleBatchOutputRoundTrip(t *testing.T) {
	evs := outputEvents()
	for i := range evs {
		evs[i].Due = int64(i)
	}
	c := &ScheduleBatch{ProposedAt: 1, Events: append(goldenEvents()[:2], evs...)}
	data := AppendScheduleBatch(nil, c)
	if CommandType(data[0]) != TypeScheduleBatchFlags {
		t.Fatalf("type %v, want ScheduleBatchFlags", CommandType(data[0]))
	}
	got, err := DecodeCommand(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, normalize(c)) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, c)
	}

	one := &ScheduleBatch{Events: []NewEvent{{ID: "a", Policy: DefaultPolicy, Output: Output{Partition: math.MaxInt32, HasPartition: true}}}}
	big := AppendScheduleBatch(nil, one) // ends in the partition's uvarint
	big = append(big[:len(big)-5], 0x80, 0x80, 0x80, 0x80, 0x08)
	one.Events[0].Output = Output{Tombstone: true}
	unknown := AppendScheduleBatch(nil, one) // ends in the flags byte
	unknown[len(unknown)-1] |= 1 << 6
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"partition > max": {big, "events[0].partition: partition 2147483648 above 2147483647"},
		"unknown flag":    {unknown, "events[0].flags: unknown flags 0x40"},
	} {
		if _, err := DecodeCommand(tc.data); !errors.Is(err, ErrMalformedCommand) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: DecodeCommand = %v, want ErrMalformedCommand naming %q", name, err, tc.want)
		}
	}
}

// TestContentHashOutput: a partition (0 included) and a tombstone each change the hash, and
// differently; the zero Output hashes as no Output did.
func TestContentHashOutput(t *testing.T) {
	h := func(o Output) uint64 {
		return ContentHash("t", []byte("k"), nil, nil, 0, 5e9, false, true, DefaultPolicy, o)
	}
	seen := map[uint64]Output{}
	for _, o := range []Output{{}, {HasPartition: true}, {Partition: 1, HasPartition: true}, {Tombstone: true},
		{HasPartition: true, Tombstone: true}, {Partition: 1, HasPartition: true, Tombstone: true}} {
		if prev, dup := seen[h(o)]; dup {
			t.Errorf("%+v hashes like %+v", o, prev)
		}
		seen[h(o)] = o
	}
	if h(Output{Partition: 5}) != h(Output{}) {
		t.Error("a partition without HasPartition changed the hash")
	}
}

// TestOutputThroughApply: an event's Output is what Get and ReadForFire return; an Update
// keeps it; a Replace takes the new event's.
func TestOutputThroughApply(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 1)
	defer f.Close()
	i := uint64(0)
	apply := func(c Command) interface{} {
		i++
		return f.Apply(cmdLog(i, c))
	}
	part := Output{Partition: 2, HasPartition: true}
	tomb := Output{Tombstone: true}
	apply(&ScheduleBatch{ProposedAt: 1, Events: []NewEvent{
		{ID: "p", Due: 100, Topic: "t", Payload: []byte("v"), Policy: DefaultPolicy, Output: part},
		{ID: "z", Due: 100, Topic: "t", Policy: Policy{Priority: 7}, Output: tomb},
		{ID: "n", Due: 100, Topic: "t", Payload: []byte("v"), Policy: DefaultPolicy},
	}})
	check := func(when string, want map[string]Output) {
		t.Helper()
		for id, o := range want {
			rec, ok, err := f.Get(id)
			if err != nil || !ok || rec.Output != o {
				t.Fatalf("%s: Get(%s) = %+v, %v, %v; want output %+v", when, id, rec.Output, ok, err, o)
			}
			recs, err := f.ReadForFire([]Ref{{Seq: rec.Seq, Due: rec.Due}}, nil)
			if err != nil || len(recs) != 1 || recs[0].Output != o {
				t.Fatalf("%s: ReadForFire(%s) = %+v, %v; want output %+v", when, id, recs, err, o)
			}
		}
	}
	check("scheduled", map[string]Output{"p": part, "z": tomb, "n": {}})
	apply(&Update{ProposedAt: 2, Changes: []Change{
		{ID: "p", Fields: ChangeDue | ChangePayload, Due: 200, Payload: []byte("w")},
		{ID: "z", Fields: ChangeKey, Key: []byte("k2")},
	}})
	check("updated", map[string]Output{"p": part, "z": tomb, "n": {}})
	apply(&ScheduleBatch{ProposedAt: 3, Events: []NewEvent{
		{ID: "p", Due: 300, Topic: "t", Policy: DefaultPolicy, Replace: true},
		{ID: "n", Due: 300, Topic: "t", Policy: DefaultPolicy, Output: tomb, Replace: true},
	}})
	check("replaced", map[string]Output{"p": {}, "z": tomb, "n": tomb})
}
