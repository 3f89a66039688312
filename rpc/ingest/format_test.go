package ingest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// The records of the tests come from this place of a schedules topic.
const (
	schedTopic     = "schedules"
	schedPartition = 3
	schedOffset    = 42
	schedSource    = "schedules/3/42"
	// schedTimestamp is the records' Kafka timestamp, Unix seconds.
	schedTimestamp = "1699999000"
)

// rec is a record of the schedules topic at schedSource; key "" means no
// key, value nil a tombstone, and hs are header names and values in pairs.
func schedRecord(key string, value []byte, hs ...string) *Record {
	r := &Record{Topic: schedTopic, Partition: schedPartition, Offset: schedOffset, Value: value, Timestamp: time.Unix(1699999000, 0)}
	if key != "" {
		r.Key = []byte(key)
	}
	for i := 0; i+1 < len(hs); i += 2 {
		r.Headers = append(r.Headers, Header{Key: hs[i], Value: []byte(hs[i+1])})
	}
	return r
}

// hdrs is event headers from names and values in pairs.
func eventHeaders(kv ...string) []*chimev1.Header {
	var out []*chimev1.Header
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &chimev1.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return out
}

// withSource is hs followed by the chime-source header of schedSource.
func withSource(hs ...*chimev1.Header) []*chimev1.Header {
	return append(hs, &chimev1.Header{Key: chimev1.HeaderSource, Value: []byte(schedSource)})
}

func unixAt(sec int64, nanos int32) *timestamppb.Timestamp {
	return &timestamppb.Timestamp{Seconds: sec, Nanos: nanos}
}

func priorityOf(v uint32) *uint32 { return &v }

func partitionOf(v int32) *int32 { return &v }

// decodeCase is one record and what a decoder must make of it: want, or
// the error text wantErr (then a *RecordError naming wantField).
type decodeCase struct {
	name      string
	opts      DecodeOptions
	rec       *Record
	want      Op
	wantErr   string
	wantField string
}

func runDecodeCases(t *testing.T, format string, cases []decodeCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dec, err := NewDecoder(format, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			got, err := dec.Decode(tc.rec)
			if tc.wantErr != "" {
				var re *RecordError
				if !errors.As(err, &re) {
					t.Fatalf("got %v, %v; want the RecordError %q", formatOp(got), err, tc.wantErr)
				}
				if err.Error() != tc.wantErr {
					t.Fatalf("error:\n got %s\nwant %s", err, tc.wantErr)
				}
				if tc.wantField != "" && re.Field != tc.wantField {
					t.Fatalf("field %q, want %q", re.Field, tc.wantField)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !equalOps(got, tc.want) {
				t.Fatalf("op:\n got %s\nwant %s", formatOp(got), formatOp(tc.want))
			}
		})
	}
}

func equalOps(a, b Op) bool {
	if a.Cancel != b.Cancel || a.Skip != b.Skip || !slices.Equal(a.IDs, b.IDs) || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		if !proto.Equal(a.Events[i], b.Events[i]) {
			return false
		}
	}
	return true
}

func formatOp(op Op) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{Cancel:%v Skip:%v IDs:%q Events:[", op.Cancel, op.Skip, op.IDs)
	for _, e := range op.Events {
		fmt.Fprintf(&b, "\n\t{%v}", e)
	}
	b.WriteString("]}")
	return b.String()
}

func TestNewDecoder(t *testing.T) {
	for _, f := range []string{"chime", "etf1", "karafka"} {
		if _, err := NewDecoder(f, DecodeOptions{}); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	_, err := NewDecoder("kms", DecodeOptions{})
	if err == nil || err.Error() != `unknown format "kms" (chime, etf1, karafka or sky)` {
		t.Errorf("unknown format: %v", err)
	}
}

// schedulesOf gives, per format, a record that schedules (id "k") and
// one that cancels it.
var schedulesOf = map[string]struct{ schedule, cancel *Record }{
	"chime": {
		schedule: schedRecord("k", []byte("v"), HeaderDeliverAt, "1700000000000", HeaderTargetTopic, "out"),
		cancel:   schedRecord("k", nil),
	},
	"etf1": {
		schedule: schedRecord("k", []byte("v"), "scheduler-epoch", "1700000000", "scheduler-target-topic", "out"),
		cancel:   schedRecord("k", nil),
	},
	"karafka": {
		schedule: schedRecord("k", []byte("v"), "schedule_schema_version", "1.0.0", "schedule_source_type", "schedule",
			"schedule_target_epoch", "1700000000", "schedule_target_topic", "out"),
		cancel: schedRecord("k", nil, "schedule_schema_version", "1.0.0", "schedule_source_type", "cancel"),
	},
}

// TestFormatsCommon checks, for every format, what format.go decides for all:
// the id, the key rules, the companions, the cancel ids and the skip.
func TestFormatsCommon(t *testing.T) {
	all := DecodeOptions{HistoryTopic: "history", TombstoneBack: true}
	for format, rs := range schedulesOf {
		t.Run(format, func(t *testing.T) {
			dec := func(opts DecodeOptions, r *Record) (Op, error) {
				d, err := NewDecoder(format, opts)
				if err != nil {
					t.Fatal(err)
				}
				return d.Decode(r)
			}
			ids := func(op Op) []string {
				var out []string
				for _, e := range op.Events {
					out = append(out, e.GetId())
				}
				return out
			}

			op, err := dec(DecodeOptions{}, rs.schedule)
			if err != nil || !slices.Equal(ids(op), []string{"schedules/k"}) {
				t.Fatalf("id without IDFromKey: %s, %v", formatOp(op), err)
			}
			ev := op.Events[0]
			if hs := ev.GetHeaders(); len(hs) == 0 || hs[len(hs)-1].GetKey() != chimev1.HeaderSource || string(hs[len(hs)-1].GetValue()) != schedSource {
				t.Errorf("the last header is not %s: %s", chimev1.HeaderSource, schedSource)
			}
			if !proto.Equal(ev.GetDeliverAt(), unixAt(1700000000, 0)) {
				t.Errorf("deliver_at %v", ev.GetDeliverAt())
			}
			op, err = dec(DecodeOptions{IDFromKey: true}, rs.schedule)
			if err != nil || !slices.Equal(ids(op), []string{"k"}) {
				t.Fatalf("id with IDFromKey: %s, %v", formatOp(op), err)
			}

			op, err = dec(all, rs.schedule)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids(op), []string{"schedules/k", "schedules/k#history", "schedules/k#tombstone-back"}) {
				t.Fatalf("companions: %s", formatOp(op))
			}
			ev, hist, back := op.Events[0], op.Events[1], op.Events[2]
			wantHist := &chimev1.Event{
				Id: "schedules/k#history", DeliverAt: ev.DeliverAt, Topic: "history",
				Key: ev.Key, Payload: ev.Payload, Headers: ev.Headers, OnConflict: ev.OnConflict,
			}
			if !proto.Equal(hist, wantHist) {
				t.Errorf("history:\n got %v\nwant %v", hist, wantHist)
			}
			wantBack := &chimev1.Event{
				Id: "schedules/k#tombstone-back", DeliverAt: ev.DeliverAt, Topic: schedTopic,
				Key: []byte("k"), Partition: partitionOf(schedPartition), Tombstone: true,
				Headers:    withSource(eventHeaders(chimev1.HeaderTombstoneBack, "true")...),
				OnConflict: ev.OnConflict,
			}
			if !proto.Equal(back, wantBack) {
				t.Errorf("tombstone back:\n got %v\nwant %v", back, wantBack)
			}
			// The companions' header slices are their own.
			op.Events[0].Headers[0] = nil
			if hist.Headers[0] == nil {
				t.Error("the history copy shares its header slice with the event")
			}

			op, err = dec(DecodeOptions{}, rs.cancel)
			if err != nil || !equalOps(op, Op{Cancel: true, IDs: []string{"schedules/k"}}) {
				t.Errorf("cancel: %s, %v", formatOp(op), err)
			}
			op, err = dec(all, rs.cancel)
			if err != nil || !equalOps(op, Op{Cancel: true, IDs: []string{"schedules/k", "schedules/k#history", "schedules/k#tombstone-back"}}) {
				t.Errorf("cancel with companions: %s, %v", formatOp(op), err)
			}
			op, err = dec(DecodeOptions{IDFromKey: true, TombstoneBack: true}, rs.cancel)
			if err != nil || !equalOps(op, Op{Cancel: true, IDs: []string{"k", "k#tombstone-back"}}) {
				t.Errorf("cancel with IDFromKey and TombstoneBack: %s, %v", formatOp(op), err)
			}

			// Chime's tombstone back, as the publisher produces it, read again.
			back2 := schedRecord("k", nil, chimev1.HeaderTombstoneBack, "true", chimev1.HeaderSource, schedSource, chimev1.HeaderID, "schedules/k#tombstone-back")
			op, err = dec(all, back2)
			if err != nil || !equalOps(op, Op{Skip: true}) {
				t.Errorf("tombstone back read again: %s, %v", formatOp(op), err)
			}

			for _, tc := range []struct {
				key  []byte
				want string
			}{
				{nil, "key: required: the record key makes the event id"},
				{[]byte{}, "key: required: the record key makes the event id"},
				{[]byte{0xff, 'k'}, `key: "\xffk" is not valid UTF-8: the record key makes the event id`},
			} {
				for _, r := range []*Record{rs.schedule, rs.cancel} {
					r2 := *r
					r2.Key = tc.key
					_, err := dec(DecodeOptions{}, &r2)
					var re *RecordError
					if !errors.As(err, &re) || re.Field != "key" || err.Error() != tc.want {
						t.Errorf("key %q: %v, want %s", tc.key, err, tc.want)
					}
				}
			}
		})
	}
}

// TestParseDeliverAt pins the conversions to protobuf times the formats share.
func TestParseDeliverAt(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want *timestamppb.Timestamp
	}{
		{"1700000000123", unixAt(1700000000, 123000000)},
		{"-1", unixAt(-1, 999000000)},
		{"0", unixAt(0, 0)},
		{"100000000000", unixAt(100000000, 0)},
		{"2026-11-28T18:00:00Z", unixAt(1795888800, 0)},
		{"2026-11-28T19:00:00.5+01:00", unixAt(1795888800, 500000000)},
	} {
		got, rule := parseDeliverAt(tc.in)
		if rule != "" || !proto.Equal(got, tc.want) {
			t.Errorf("%s: %v, %q; want %v", tc.in, got, rule, tc.want)
		}
	}
}

// FuzzDecoders: no record makes a decoder panic, every failure is a
// RecordError, and every Op is well formed: exactly one of skip, cancel
// (ids, no events) or schedule (events with ids, each ending with the
// record's chime-source header).
func FuzzDecoders(f *testing.F) {
	for _, rs := range schedulesOf {
		for _, r := range []*Record{rs.schedule, rs.cancel} {
			var hs []byte
			for _, h := range r.Headers {
				hs = fmt.Appendf(hs, "%s=%s\n", h.Key, h.Value)
			}
			for format := range byte(3) {
				f.Add(format, r.Key, r.Value, r.Value == nil, hs, false)
			}
		}
	}
	f.Fuzz(func(t *testing.T, format byte, key, value []byte, tombstone bool, headers []byte, companions bool) {
		r := &Record{Topic: schedTopic, Partition: schedPartition, Offset: schedOffset, Key: key, Value: value}
		if tombstone {
			r.Value = nil
		} else if r.Value == nil {
			r.Value = []byte{}
		}
		for line := range strings.SplitSeq(string(headers), "\n") {
			if line == "" {
				continue
			}
			k, v, _ := strings.Cut(line, "=")
			r.Headers = append(r.Headers, Header{Key: k, Value: []byte(v)})
		}
		opts := DecodeOptions{}
		if companions {
			opts = DecodeOptions{HistoryTopic: "history", TombstoneBack: true}
		}
		name := [...]string{"chime", "etf1", "karafka"}[int(format)%3]
		dec, err := NewDecoder(name, opts)
		if err != nil {
			t.Fatal(err)
		}
		op, err := dec.Decode(r)
		if err != nil {
			var re *RecordError
			if !errors.As(err, &re) || re.Field == "" || re.Rule == "" {
				t.Fatalf("%s: error %v is not a RecordError with a field and a rule", name, err)
			}
			return
		}
		switch {
		case op.Skip:
			if op.Cancel || len(op.IDs) > 0 || len(op.Events) > 0 || r.Value != nil {
				t.Fatalf("%s: skip %s of a record with a value", name, formatOp(op))
			}
		case op.Cancel:
			if len(op.IDs) == 0 || len(op.Events) > 0 {
				t.Fatalf("%s: cancel %s", name, formatOp(op))
			}
		default:
			if len(op.Events) == 0 || len(op.IDs) > 0 {
				t.Fatalf("%s: schedule %s", name, formatOp(op))
			}
			for _, ev := range op.Events {
				hs := ev.GetHeaders()
				if ev.GetId() == "" || len(hs) == 0 || hs[len(hs)-1].GetKey() != chimev1.HeaderSource || string(hs[len(hs)-1].GetValue()) != schedSource {
					t.Fatalf("%s: event without an id or chime-source: %v", name, ev)
				}
				if ev.GetTombstone() && len(ev.GetPayload()) > 0 {
					t.Fatalf("%s: a tombstone with a payload: %v", name, ev)
				}
			}
		}
	})
}
