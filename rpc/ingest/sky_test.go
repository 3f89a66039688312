package ingest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// skyDue is the due time of the test schedules: 2030-01-02T03:04:05.678Z.
var skyDue = time.Date(2030, 1, 2, 3, 4, 5, 678e6, time.UTC)

// skyIn is a KMS schedule as the tests encode it, with the embedded
// schemas (the one without headers ignores Headers).
type skyIn = skySchedule

// sky joins the checks that every format passes (TestFormatsCommon).
func init() {
	schemas, err := skySchemas()
	if err != nil {
		panic(err)
	}
	v, err := avro.Marshal(schemas[0], skyIn{Time: 1_700_000_000_000, Topic: "out", Value: ptr([]byte("v"))})
	if err != nil {
		panic(err)
	}
	schedulesOf["sky"] = struct{ schedule, cancel *Record }{schedRecord("k", v), schedRecord("k", nil)}
}

// skyTestDecoder is the sky Decoder and, for the tests of its registry
// cache, the skyDecoder inside it.
func skyTestDecoder(t testing.TB, opts DecodeOptions) skyTest {
	t.Helper()
	d, err := newSkyDecoder(opts)
	if err != nil {
		t.Fatal(err)
	}
	return skyTest{Decoder: keyed{d.common, d.decode}, skyDecoder: d}
}

type skyTest struct {
	Decoder
	*skyDecoder
}

func (s skyTest) Decode(r *Record) (Op, error) { return s.Decoder.Decode(r) }

// skyEncode encodes in with the embedded schema with headers, or without.
func skyEncode(t testing.TB, withHeaders bool, in skyIn) []byte {
	t.Helper()
	schemas, err := skySchemas()
	if err != nil {
		t.Fatal(err)
	}
	s := schemas[1]
	if withHeaders {
		s = schemas[0]
	}
	b, err := avro.Marshal(s, in)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// avroLong and avroBytes write the Avro binary encoding by the
// specification (zig-zag varints; bytes and strings length-prefixed), as
// Avro Java's BinaryEncoder does, independently of the library under test.
func avroLong(b []byte, v int64) []byte {
	return binary.AppendUvarint(b, uint64(v<<1)^uint64(v>>63))
}

func avroBytes(b []byte, p string) []byte {
	return append(avroLong(b, int64(len(p))), p...)
}

func skyRecord(value []byte) *Record {
	return &Record{Topic: "schedules", Partition: 3, Offset: 42, Key: []byte("sched-1"), Value: value}
}

func ptr[T any](v T) *T { return &v }

// checkOp fails t unless got is want, field by field.
func checkOp(t *testing.T, got, want Op) {
	t.Helper()
	if got.Cancel != want.Cancel || got.Skip != want.Skip || fmt.Sprint(got.IDs) != fmt.Sprint(want.IDs) {
		t.Errorf("op: cancel %v skip %v ids %q; want cancel %v skip %v ids %q",
			got.Cancel, got.Skip, got.IDs, want.Cancel, want.Skip, want.IDs)
	}
	if len(got.Events) != len(want.Events) {
		t.Fatalf("%d events; want %d", len(got.Events), len(want.Events))
	}
	for i := range got.Events {
		if !proto.Equal(got.Events[i], want.Events[i]) {
			t.Errorf("event %d:\n got %s\nwant %s", i, prototext.Format(got.Events[i]), prototext.Format(want.Events[i]))
		}
	}
}

func skySource() *chimev1.Header {
	return &chimev1.Header{Key: chimev1.HeaderSource, Value: []byte("schedules/3/42")}
}

func TestSkyIsAFormat(t *testing.T) {
	d, err := NewDecoder("sky", DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := d.Decode(skyRecord(skyEncode(t, true, skyIn{Time: 1, Topic: "out", Value: ptr([]byte("v"))})))
	if err != nil || len(op.Events) != 1 || op.Events[0].GetTopic() != "out" {
		t.Fatalf("NewDecoder(sky) decoded a sky schedule as %+v, %v", op, err)
	}
}

// TestSkySchemas pins the embedded schemas to the layout of KMS's case
// classes: the field order and types are the binary format.
func TestSkySchemas(t *testing.T) {
	schemas, err := skySchemas()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{
		`time:long topic:string key:bytes value:[null,bytes] headers:map<bytes>`,
		`time:long topic:string key:bytes value:[null,bytes]`,
	} {
		var got []string
		for _, f := range schemas[i].(*avro.RecordSchema).Fields() {
			typ := string(f.Type().Type())
			switch s := f.Type().(type) {
			case *avro.UnionSchema:
				var ts []string
				for _, u := range s.Types() {
					ts = append(ts, string(u.Type()))
				}
				typ = "[" + strings.Join(ts, ",") + "]"
			case *avro.MapSchema:
				typ = "map<" + string(s.Values().Type()) + ">"
			}
			got = append(got, f.Name()+":"+typ)
		}
		if g := strings.Join(got, " "); g != want {
			t.Errorf("schema %d: %s; want %s", i, g, want)
		}
	}
	// The README names the source of each file it lists.
	readme, err := os.ReadFile("sky-schemas/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"schedule.avsc", "schedule-without-headers.avsc", "96e4125e5195f2976ac448ca9d9622922ae661b3"} {
		if !bytes.Contains(readme, []byte(s)) {
			t.Errorf("sky-schemas/README.md does not mention %s", s)
		}
	}
}

// TestSkySpecBytes decodes bodies written byte by byte as Avro Java writes
// them (a map as one block of a positive count, then 0), and checks that
// the embedded schema writes the same bytes.
func TestSkySpecBytes(t *testing.T) {
	ms := skyDue.UnixMilli()
	prefix := avroLong(nil, ms)
	prefix = avroBytes(prefix, "out.topic")
	prefix = avroBytes(prefix, "target-key")
	prefix = avroLong(prefix, 1) // union branch 1: bytes
	prefix = avroBytes(prefix, "payload")

	withHeaders := avroLong(bytes.Clone(prefix), 2) // one block of two entries
	withHeaders = avroBytes(withHeaders, "zeta")
	withHeaders = avroBytes(withHeaders, "last")
	withHeaders = avroBytes(withHeaders, "alpha")
	withHeaders = avroBytes(withHeaders, "first")
	withHeaders = avroLong(withHeaders, 0) // end of the map

	want := &chimev1.Event{
		Id:        "schedules/sched-1",
		DeliverAt: timestamppb.New(skyDue),
		Topic:     "out.topic",
		Key:       []byte("target-key"),
		Payload:   []byte("payload"),
		Headers: []*chimev1.Header{
			{Key: "alpha", Value: []byte("first")},
			{Key: "zeta", Value: []byte("last")},
			skySource(),
		},
		OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE,
	}
	d := skyTestDecoder(t, DecodeOptions{})
	op, err := d.Decode(skyRecord(withHeaders))
	if err != nil {
		t.Fatal(err)
	}
	checkOp(t, op, Op{Events: []*chimev1.Event{want}})

	// Without headers: the same four fields and nothing after them.
	op, err = d.Decode(skyRecord(prefix))
	if err != nil {
		t.Fatal(err)
	}
	noHeaders := proto.Clone(want).(*chimev1.Event)
	noHeaders.Headers = []*chimev1.Header{skySource()}
	checkOp(t, op, Op{Events: []*chimev1.Event{noHeaders}})

	// The embedded schema encodes as the specification does (one header:
	// a map's order is the writer's).
	schemas, _ := skySchemas()
	oneHeader := avroLong(bytes.Clone(prefix), 1)
	oneHeader = avroBytes(oneHeader, "alpha")
	oneHeader = avroBytes(oneHeader, "first")
	oneHeader = avroLong(oneHeader, 0)
	in := skyIn{Time: ms, Topic: "out.topic", Key: []byte("target-key"), Value: ptr([]byte("payload")),
		Headers: map[string][]byte{"alpha": []byte("first")}}
	got, err := avro.Config{DisableBlockSizeHeader: true}.Freeze().Marshal(schemas[0], in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, oneHeader) {
		t.Errorf("schedule.avsc encodes\n%x\nthe specification\n%x", got, oneHeader)
	}
	got, err = avro.Marshal(schemas[1], in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, prefix) {
		t.Errorf("schedule-without-headers.avsc encodes\n%x\nthe specification\n%x", got, prefix)
	}
}

func TestSkyDecode(t *testing.T) {
	ms := skyDue.UnixMilli()
	event := func(payload []byte, tombstone bool, hs ...*chimev1.Header) *chimev1.Event {
		return &chimev1.Event{
			Id:         "schedules/sched-1",
			DeliverAt:  timestamppb.New(skyDue),
			Topic:      "out",
			Key:        []byte("k"),
			Payload:    payload,
			Tombstone:  tombstone,
			Headers:    append(hs, skySource()),
			OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE,
		}
	}
	three := map[string][]byte{"b": []byte("2"), "c": []byte("3"), "a": []byte("1")}
	sorted := []*chimev1.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}, {Key: "c", Value: []byte("3")}}
	for _, tc := range []struct {
		name        string
		withHeaders bool
		in          skyIn
		want        *chimev1.Event
	}{
		{"headers", true, skyIn{ms, "out", []byte("k"), ptr([]byte("payload")), three}, event([]byte("payload"), false, sorted...)},
		{"no headers", false, skyIn{ms, "out", []byte("k"), ptr([]byte("payload")), nil}, event([]byte("payload"), false)},
		{"empty headers", true, skyIn{ms, "out", []byte("k"), ptr([]byte("payload")), nil}, event([]byte("payload"), false)},
		{"null value", true, skyIn{ms, "out", []byte("k"), nil, three}, event(nil, true, sorted...)},
		{"null value, no headers", false, skyIn{ms, "out", []byte("k"), nil, nil}, event(nil, true)},
		// An empty value is a record with an empty value, not a tombstone.
		{"empty value", true, skyIn{ms, "out", []byte("k"), ptr([]byte{}), nil}, event([]byte{}, false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := skyTestDecoder(t, DecodeOptions{})
			op, err := d.Decode(skyRecord(skyEncode(t, tc.withHeaders, tc.in)))
			if err != nil {
				t.Fatal(err)
			}
			checkOp(t, op, Op{Events: []*chimev1.Event{tc.want}})
		})
	}
}

// TestSkyTimes: the due time is exact to the millisecond, before 1970 too.
func TestSkyTimes(t *testing.T) {
	d := skyTestDecoder(t, DecodeOptions{})
	for _, ms := range []int64{1, -1, 1_767_225_600_123, -62_135_596_800_000} {
		op, err := d.Decode(skyRecord(skyEncode(t, true, skyIn{Time: ms, Topic: "out", Value: ptr([]byte("v"))})))
		if err != nil {
			t.Fatal(err)
		}
		if got := op.Events[0].GetDeliverAt().AsTime(); !got.Equal(time.UnixMilli(ms)) {
			t.Errorf("time %d: deliver_at %v; want %v", ms, got, time.UnixMilli(ms).UTC())
		}
	}
}

func TestSkyIDFromKey(t *testing.T) {
	d := skyTestDecoder(t, DecodeOptions{IDFromKey: true})
	op, err := d.Decode(skyRecord(skyEncode(t, true, skyIn{Time: 1, Topic: "out", Value: ptr([]byte("v"))})))
	if err != nil {
		t.Fatal(err)
	}
	if got := op.Events[0].GetId(); got != "sched-1" {
		t.Errorf("id %q; want sched-1", got)
	}
	op, err = d.Decode(skyRecord(nil))
	if err != nil {
		t.Fatal(err)
	}
	checkOp(t, op, Op{Cancel: true, IDs: []string{"sched-1"}})
}

func TestSkyTombstoneCancels(t *testing.T) {
	op, err := skyTestDecoder(t, DecodeOptions{}).Decode(skyRecord(nil))
	if err != nil {
		t.Fatal(err)
	}
	checkOp(t, op, Op{Cancel: true, IDs: []string{"schedules/sched-1"}})

	// With companions, the cancel names them too.
	op, err = skyTestDecoder(t, DecodeOptions{TombstoneBack: true}).Decode(skyRecord(nil))
	if err != nil {
		t.Fatal(err)
	}
	checkOp(t, op, Op{Cancel: true, IDs: []string{"schedules/sched-1", "schedules/sched-1#tombstone-back"}})

	// KMS's own tombstone (schedule:expired) cancels as any other does.
	r := skyRecord(nil)
	r.Headers = []Header{{Key: "schedule:expired", Value: []byte("true")}}
	op, err = skyTestDecoder(t, DecodeOptions{}).Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	checkOp(t, op, Op{Cancel: true, IDs: []string{"schedules/sched-1"}})

	// Chime's own tombstone back is skipped.
	r.Headers = []Header{{Key: chimev1.HeaderTombstoneBack, Value: []byte("true")}}
	op, err = skyTestDecoder(t, DecodeOptions{TombstoneBack: true}).Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	checkOp(t, op, Op{Skip: true})
}

func TestSkyTombstoneBackCompanion(t *testing.T) {
	d := skyTestDecoder(t, DecodeOptions{TombstoneBack: true})
	op, err := d.Decode(skyRecord(skyEncode(t, true, skyIn{Time: skyDue.UnixMilli(), Topic: "out", Key: []byte("k"), Value: ptr([]byte("v"))})))
	if err != nil {
		t.Fatal(err)
	}
	if len(op.Events) != 2 {
		t.Fatalf("%d events; want the schedule and its tombstone back", len(op.Events))
	}
	back := op.Events[1]
	if back.GetId() != "schedules/sched-1#tombstone-back" || back.GetTopic() != "schedules" || !back.GetTombstone() ||
		back.GetPartition() != 3 || string(back.GetKey()) != "sched-1" || !back.GetDeliverAt().AsTime().Equal(skyDue) {
		t.Errorf("tombstone back: %s", prototext.Format(back))
	}
}

// TestSkyFallback: KMS's choice of schema, byte for byte. A body whose
// headers do not decode is read without them, and bytes after the record
// are ignored.
func TestSkyFallback(t *testing.T) {
	ms := skyDue.UnixMilli()
	full := skyEncode(t, true, skyIn{ms, "out", []byte("k"), ptr([]byte("v")), map[string][]byte{"h": []byte("x")}})
	prefix := skyEncode(t, false, skyIn{Time: ms, Topic: "out", Key: []byte("k"), Value: ptr([]byte("v"))})
	if !bytes.HasPrefix(full, prefix) {
		t.Fatalf("the schema with headers does not start as the one without: %x, %x", full, prefix)
	}
	d := skyTestDecoder(t, DecodeOptions{})
	for _, tc := range []struct {
		name    string
		body    []byte
		headers int
	}{
		{"headers cut short", full[:len(full)-2], 0},
		{"garbage for headers", append(bytes.Clone(prefix), 0x7f), 0}, // a block of -64 entries, then nothing
		{"bytes after the record", append(bytes.Clone(full), "trailing"...), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op, err := d.Decode(skyRecord(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			ev := op.Events[0]
			if n := len(ev.GetHeaders()) - 1; n != tc.headers || string(ev.GetPayload()) != "v" || ev.GetTopic() != "out" {
				t.Errorf("%s", prototext.Format(ev))
			}
		})
	}
}

// TestSkyLargeValue: a payload past hamba's default bound (1 MiB) decodes,
// as KMS takes it.
func TestSkyLargeValue(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 3<<20)
	op, err := skyTestDecoder(t, DecodeOptions{}).Decode(skyRecord(skyEncode(t, true, skyIn{Time: 1, Topic: "out", Value: &big})))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(op.Events[0].GetPayload(), big) {
		t.Errorf("payload of %d bytes; want %d", len(op.Events[0].GetPayload()), len(big))
	}
}

func TestSkyRecordErrors(t *testing.T) {
	ms := skyDue.UnixMilli()
	good := skyEncode(t, true, skyIn{ms, "out", []byte("k"), ptr([]byte("payload")), nil})
	prefix := avroBytes(avroLong(nil, ms), "out") // time, topic
	for _, tc := range []struct {
		name        string
		key, value  []byte
		field, rule string
	}{
		{name: "no key", value: good, field: "key", rule: "required: the record key makes the event id"},
		{name: "no key, tombstone", field: "key", rule: "required: the record key makes the event id"},
		{name: "empty", value: []byte{}, field: "value", rule: "not a sky schedule in Avro: its 0 bytes end inside the record"},
		// 'f' is time 51, 'o' a string length of -56.
		{name: "garbage", value: []byte("foobar"), field: "value", rule: `not a sky schedule in Avro: field "topic": invalid string length`},
		{name: "cut in the time", value: good[:2], field: "value", rule: "not a sky schedule in Avro: its 2 bytes end inside the record"},
		{name: "cut in the topic", value: good[:7], field: "value", rule: "not a sky schedule in Avro: its 7 bytes end inside the record"},
		{name: "cut before the value", value: good[:len(prefix)+2], field: "value", rule: fmt.Sprintf("not a sky schedule in Avro: its %d bytes end inside the record", len(prefix)+2)},
		{name: "cut in the value", value: good[:len(good)-3], field: "value", rule: fmt.Sprintf("not a sky schedule in Avro: its %d bytes end inside the record", len(good)-3)},
		{name: "a length past the end", value: avroLong(bytes.Clone(prefix), 1<<40), field: "value", rule: fmt.Sprintf("not a sky schedule in Avro: its %d bytes end inside the record", len(prefix)+6)},
		{name: "union branch 2", value: avroLong(avroBytes(bytes.Clone(prefix), "k"), 2), field: "value", rule: `not a sky schedule in Avro: field "value": unknown union type`},
		{name: "union branch -1", value: avroLong(avroBytes(bytes.Clone(prefix), "k"), -1), field: "value", rule: `not a sky schedule in Avro: field "value": unknown union type`},
		// hamba reads a varint of more than ten bytes from a buffer as one
		// that ends with the buffer.
		{name: "time of 11 bytes", value: bytes.Repeat([]byte{0xff}, 11), field: "value", rule: "not a sky schedule in Avro: its 11 bytes end inside the record"},
		{name: "no topic", value: skyEncode(t, true, skyIn{Time: ms, Value: ptr([]byte("v"))}), field: "topic", rule: "required"},
		// Read bare, the wire format's id decodes as time 0, no topic, no
		// key, a null value, whatever follows.
		{name: "wire format without a registry", value: skyWire(7, skyEncode(t, true, skyIn{ms, "out", []byte("k"), ptr([]byte("v")), nil})), field: "topic",
			rule: "required (the value starts as the Confluent wire format would, with schema id 7: does the source need its schema registry?)"},
		{name: "wire format of a large id without a registry", value: skyWire(0x01020304, nil), field: "value",
			rule: "not a sky schedule in Avro: field \"topic\": invalid string length (the value starts as the Confluent wire format would, with schema id 16909060: does the source need its schema registry?)"},
		{name: "a chime- header", value: skyEncode(t, true, skyIn{ms, "out", nil, ptr([]byte("v")), map[string][]byte{"ok": nil, "Chime-Id": []byte("x")}}),
			field: "headers", rule: `"Chime-Id": the "chime-" prefix is reserved for headers Chime adds`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key
			if key == nil && tc.field != "key" {
				key = []byte("sched-1")
			}
			op, err := skyTestDecoder(t, DecodeOptions{}).Decode(&Record{Topic: "schedules", Key: key, Value: tc.value})
			var re *RecordError
			if !errors.As(err, &re) {
				t.Fatalf("Decode: %+v, %v; want a RecordError", op, err)
			}
			if re.Field != tc.field || re.Rule != tc.rule {
				t.Errorf("error\n%s: %s\nwant\n%s: %s", re.Field, re.Rule, tc.field, tc.rule)
			}
		})
	}
}

// skyRegistryServer serves schema ids as a Confluent schema registry does,
// counting the requests per id; status holds a forced answer per id.
type skyRegistryServer struct {
	*httptest.Server
	schemas map[string]string // id -> schema JSON
	status  map[string]int    // id -> a status to answer instead
	hits    sync.Map          // id -> *atomic.Int32
	block   chan struct{}     // requests for skyBlockID wait for it to close
}

func newSkyRegistryServer(t *testing.T, schemas map[string]string) *skyRegistryServer {
	s := &skyRegistryServer{schemas: schemas, status: map[string]int{}, block: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := strings.CutPrefix(r.URL.Path, "/registry/schemas/ids/")
		if !ok || r.Method != http.MethodGet {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
			return
		}
		if user, pass, ok := r.BasicAuth(); !ok || user != "chime" || pass != "s3cret" {
			http.Error(w, `{"error_code":401,"message":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		n, _ := s.hits.LoadOrStore(id, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		if id == fmt.Sprint(skyBlockID) {
			select {
			case <-s.block:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if code := s.status[id]; code != 0 {
			w.WriteHeader(code)
			_, _ = fmt.Fprintf(w, `{"error_code":%d,"message":"forced"}`, code*100)
			return
		}
		schema, ok := s.schemas[id]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = fmt.Fprintf(w, `{"error_code":40403,"message":"Schema %s not found"}`, id)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"schema": schema})
	}))
	t.Cleanup(func() { close(s.block); s.Close() })
	return s
}

func (s *skyRegistryServer) count(id string) int32 {
	n, ok := s.hits.Load(id)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

// registryURL is the server's registry URL with its credentials; shown is
// how errors show it.
func (s *skyRegistryServer) registryURL() (u, shown string) {
	host := strings.TrimPrefix(s.URL, "http://")
	return "http://chime:s3cret@" + host + "/registry", "http://chime:xxxxx@" + host + "/registry"
}

// skyBlockID is the schema id the test registry never answers.
const skyBlockID = 13

func skyWire(id uint32, body []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{0}, id), body...)
}

// A producer's own schema: its fields in another order, one more, no
// headers, value a plain bytes and time a timestamp-millis.
const skyTheirSchema = `{"type": "record", "name": "Reminder", "namespace": "com.example", "fields": [
	{"name": "topic", "type": "string"},
	{"name": "tags", "type": {"type": "array", "items": "string"}},
	{"name": "time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
	{"name": "key", "type": "bytes"},
	{"name": "value", "type": "bytes"}]}`

func TestSkyRegistry(t *testing.T) {
	ms := skyDue.UnixMilli()
	srv := newSkyRegistryServer(t, map[string]string{
		"7":  skyTheirSchema,
		"8":  skyScheduleAvsc,
		"9":  `{"type": "record", "name": "NoTime", "fields": [{"name": "topic", "type": "string"}, {"name": "key", "type": "bytes"}, {"name": "value", "type": "bytes"}]}`,
		"10": strings.Replace(skyTheirSchema, "timestamp-millis", "timestamp-micros", 1),
		"11": `"string"`,
	})
	srv.status["12"] = http.StatusInternalServerError
	u, shown := srv.registryURL()
	d := skyTestDecoder(t, DecodeOptions{SchemaRegistry: u})

	theirs, err := avro.ParseWithCache(skyTheirSchema, "", &avro.SchemaCache{})
	if err != nil {
		t.Fatal(err)
	}
	body, err := avro.Marshal(theirs, map[string]any{
		"topic": "out", "tags": []string{"a", "b"}, "time": skyDue, "key": []byte("k"), "value": []byte("v"),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := &chimev1.Event{
		Id: "schedules/sched-1", DeliverAt: timestamppb.New(skyDue), Topic: "out", Key: []byte("k"), Payload: []byte("v"),
		Headers: []*chimev1.Header{skySource()}, OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE,
	}
	for range 3 {
		op, err := d.Decode(skyRecord(skyWire(7, body)))
		if err != nil {
			t.Fatal(err)
		}
		checkOp(t, op, Op{Events: []*chimev1.Event{want}})
	}
	if n := srv.count("7"); n != 1 {
		t.Errorf("schema 7 fetched %d times; want once", n)
	}

	// KMS's own schema, through the registry, headers included; a bare
	// body still decodes beside the wire format.
	kms := skyEncode(t, true, skyIn{ms, "out", []byte("k"), ptr([]byte("v")), map[string][]byte{"h": []byte("x")}})
	for _, v := range [][]byte{skyWire(8, kms), kms} {
		op, err := d.Decode(skyRecord(v))
		if err != nil {
			t.Fatal(err)
		}
		withHeader := proto.Clone(want).(*chimev1.Event)
		withHeader.Headers = []*chimev1.Header{{Key: "h", Value: []byte("x")}, skySource()}
		checkOp(t, op, Op{Events: []*chimev1.Event{withHeader}})
	}

	for _, tc := range []struct {
		name  string
		value []byte
		rule  string
		hits  int32 // of the schema id after two decodes: 1 when the verdict is kept
	}{
		{"unknown id", skyWire(99, kms), fmt.Sprintf("schema id 99 is not in the schema registry %s", shown), 2},
		{"no time", skyWire(9, kms), `schema id 9 is not a sky schedule: it has no field "time"`, 1},
		{"microseconds", skyWire(10, kms), `schema id 10 is not a sky schedule: field "time" is {"type":"long","logicalType":"timestamp-micros"}, where sky's is "long" (or a timestamp-millis long)`, 1},
		{"not a record", skyWire(11, kms), `schema id 11 is not a sky schedule: it is a string, not a record`, 1},
		{"body not of the schema", skyWire(7, nil), `not a sky schedule in Avro: with schema id 7: its 0 bytes end inside the record`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 2 {
				_, err := d.Decode(skyRecord(tc.value))
				var re *RecordError
				if !errors.As(err, &re) {
					t.Fatalf("Decode: %v; want a RecordError", err)
				}
				if re.Field != "value" || re.Rule != tc.rule {
					t.Errorf("error\n%s: %s\nwant\nvalue: %s", re.Field, re.Rule, tc.rule)
				}
			}
			id := fmt.Sprint(binary.BigEndian.Uint32(tc.value[1:5]))
			if n := srv.count(id); n != tc.hits {
				t.Errorf("schema %s fetched %d times; want %d", id, n, tc.hits)
			}
		})
	}

	// A registry that fails is no verdict on the record: not a RecordError,
	// not kept, and its credentials are not in the error.
	for range 2 {
		_, err := d.Decode(skyRecord(skyWire(12, kms)))
		var re *RecordError
		if err == nil || errors.As(err, &re) {
			t.Fatalf("Decode with the registry failing: %v; want an error that is not a RecordError", err)
		}
		if wantErr := fmt.Sprintf(`sky: schema registry %s: schema id 12: 500 Internal Server Error: {"error_code":50000,"message":"forced"}`, shown); err.Error() != wantErr {
			t.Errorf("error\n%v\nwant\n%s", err, wantErr)
		}
	}
	if n := srv.count("12"); n != 2 {
		t.Errorf("schema 12 fetched %d times; want 2 (a failure is not kept)", n)
	}
}

func TestSkyRegistryTimeout(t *testing.T) {
	srv := newSkyRegistryServer(t, nil)
	u, _ := srv.registryURL()
	d := skyTestDecoder(t, DecodeOptions{SchemaRegistry: u})
	d.registry.client.Timeout = 100 * time.Millisecond
	start := time.Now()
	_, err := d.Decode(skyRecord(skyWire(skyBlockID, []byte{2})))
	var re *RecordError
	if err == nil || errors.As(err, &re) || !strings.Contains(err.Error(), "Client.Timeout exceeded") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Decode with the registry silent: %v; want a timeout, not a RecordError, without the password", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("the timeout took %v", el)
	}
}

func TestSkyRegistryURL(t *testing.T) {
	for _, u := range []string{"registry:8081", "ftp://registry", "http://", "%zz"} {
		if _, err := newSkyDecoder(DecodeOptions{SchemaRegistry: u}); err == nil {
			t.Errorf("schema registry %q accepted", u)
		}
	}
}

// TestSkyConcurrent decodes from many goroutines, as the consumer does one
// per partition, through the registry and its cache.
func TestSkyConcurrent(t *testing.T) {
	srv := newSkyRegistryServer(t, map[string]string{"8": skyScheduleAvsc})
	u, _ := srv.registryURL()
	d := skyTestDecoder(t, DecodeOptions{SchemaRegistry: u})
	var values [8][50][]byte
	for g := range values {
		for i := range values[g] {
			values[g][i] = skyWire(8, skyEncode(t, true, skyIn{int64(i), "out", []byte("k"), ptr([]byte(fmt.Sprint(g, i))), nil}))
		}
	}
	var wg sync.WaitGroup
	for g := range values {
		wg.Go(func() {
			for i, v := range values[g] {
				op, err := d.Decode(skyRecord(v))
				if err != nil {
					t.Error(err)
					return
				}
				if got := string(op.Events[0].GetPayload()); got != fmt.Sprint(g, i) {
					t.Errorf("payload %q; want %q", got, fmt.Sprint(g, i))
				}
			}
		})
	}
	wg.Wait()
	if n := srv.count("8"); n < 1 || n > 8 {
		t.Errorf("schema 8 fetched %d times; want once per goroutine at most", n)
	}
}

// FuzzSkyDecode: no body makes the decoder panic or allocate far past its
// size, and every failure is a RecordError naming the value.
func FuzzSkyDecode(f *testing.F) {
	f.Add(skyEncode(f, true, skyIn{1, "out", []byte("k"), ptr([]byte("v")), map[string][]byte{"a": []byte("b")}}))
	f.Add(skyEncode(f, false, skyIn{1, "out", []byte("k"), nil, nil}))
	f.Add([]byte("foobar"))
	f.Add(avroLong(avroBytes(avroLong(nil, 1), "out"), 1<<60))
	f.Add([]byte{0, 0, 0, 0, 7, 2})
	d := skyTestDecoder(f, DecodeOptions{})
	f.Fuzz(func(t *testing.T, v []byte) {
		op, err := d.Decode(&Record{Topic: "schedules", Key: []byte("k"), Value: v})
		if err != nil {
			var re *RecordError
			if !errors.As(err, &re) || (re.Field != "value" && re.Field != "headers" && re.Field != "topic") {
				t.Fatalf("error %v", err)
			}
			return
		}
		if len(op.Events) != 1 || op.Events[0].GetDeliverAt() == nil {
			t.Fatalf("op %+v", op)
		}
		if n := len(op.Events[0].GetPayload()) + len(op.Events[0].GetKey()) + len(op.Events[0].GetTopic()); n > len(v) {
			t.Fatalf("%d bytes of content from a body of %d", n, len(v))
		}
	})
}
