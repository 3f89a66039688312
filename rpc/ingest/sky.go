package ingest

// The sky format is the contract of github.com/sky-uk/kafka-message-scheduler
// (KMS) as read at commit 96e4125e5195f2976ac448ca9d9622922ae661b3 (v1.0.1's
// scheduler code), and at scheduler-0.27.0 for the records its older
// releases read; sky-schemas/README.md gives the files:
//
//   - The record key (a string) is the schedule id; a null value (a Kafka
//     tombstone) cancels it.
//   - The value is a bare Avro body, no registry, no version marker, of
//     sky-schemas/schedule.avsc: time (epoch milliseconds), topic, key,
//     value (null: fire a tombstone) and headers (a map of bytes). Records
//     of older producers lack headers (schedule-without-headers.avsc). KMS
//     decodes with the schema with headers first and, only if that fails,
//     with the one without; bytes left after the record are ignored. This
//     decoder does the same, so what KMS scheduled Chime schedules, and
//     what KMS could not decode Chime rejects.
//   - A new record under a key replaces the schedule (ON_CONFLICT_REPLACE).
//
// Where Chime differs from KMS, on purpose:
//   - A record KMS cannot decode is logged by KMS, and cancels the schedule
//     its key had (Scheduler.scala: Left(_) => cancel(key)). Chime rejects
//     it (the rejected topic, with chime-error) and leaves the schedule
//     alone: a record nobody can read is not taken as a cancel.
//   - KMS ignores a tombstone carrying its own schedule:expired: true (the
//     tombstone it writes back after firing). Chime cancels the id as for
//     any tombstone: the event is gone or, when Chime reads a topic KMS
//     served, one KMS delivered already.
//   - The headers are produced sorted by name; KMS's order is its Scala
//     Map's (insertion order up to four, hash order beyond). A header named
//     chime-* (any case) is an error: the prefix is Chime's.
//   - A past time fires at once, as in KMS; a time past Chime's horizon is
//     rejected by the Schedule rules, where KMS waits (up to 292 years).
//   - An empty Avro key fires a record without a key, which Chime keys by
//     the event id; KMS sends an empty key.
//   - With DecodeOptions.SchemaRegistry, a value in the Confluent wire
//     format (byte 0, a 4-byte big-endian schema id, the Avro body) is read
//     with the writer schema the registry has under that id; KMS never
//     released this (a 2020 branch). A bare body still decodes, unless its
//     time is exactly 0 (its first byte is then 0 too, and it is taken for
//     the wire format).

import (
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/bits"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// The schemas of KMS's two schedule types, embedded: the decoder runs on
// them. sky-schemas/README.md says where they come from.
var (
	//go:embed sky-schemas/schedule.avsc
	skyScheduleAvsc string
	//go:embed sky-schemas/schedule-without-headers.avsc
	skyScheduleWithoutHeadersAvsc string
)

// skySchemas parses the embedded schemas once. Each gets a cache of its own:
// avro.Parse registers named types in a process-wide cache by full name,
// and a registry's writer schema may reuse KMS's names with other fields.
var skySchemas = sync.OnceValues(func() ([2]avro.Schema, error) {
	var out [2]avro.Schema
	for i, text := range [2]string{skyScheduleAvsc, skyScheduleWithoutHeadersAvsc} {
		s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
		if err != nil {
			return out, fmt.Errorf("sky: embedded schema %d: %w", i, err)
		}
		out[i] = s
	}
	return out, nil
})

// skySchedule is a KMS schedule as decoded; the schema without headers
// leaves Headers nil.
type skySchedule struct {
	Time    int64             `avro:"time"`
	Topic   string            `avro:"topic"`
	Key     []byte            `avro:"key"`
	Value   *[]byte           `avro:"value"`
	Headers map[string][]byte `avro:"headers"`
}

// skySchedulePlain is a schedule whose writer schema has a value of plain
// "bytes", never null (a registry's writer schema may): hamba decodes only
// a union into a pointer.
type skySchedulePlain struct {
	Time    int64             `avro:"time"`
	Topic   string            `avro:"topic"`
	Key     []byte            `avro:"key"`
	Value   []byte            `avro:"value"`
	Headers map[string][]byte `avro:"headers"`
}

// skyNotAvro starts the rule of a value that does not decode.
const skyNotAvro = "not a sky schedule in Avro: "

// skyRegistryTimeout bounds one schema fetch from the registry. The
// consumer's partition waits meanwhile, so it is short; a fetch that times
// out fails the record's decoding with an error that is not a RecordError.
const skyRegistryTimeout = 10 * time.Second

// skyDecoder decodes KMS records. It is safe for concurrent use: the
// consumer decodes the partitions of a topic in parallel.
type skyDecoder struct {
	common
	withHeaders, withoutHeaders avro.Schema
	// registry is nil unless DecodeOptions.SchemaRegistry is set.
	registry *skyRegistry
}

func newSkyDecoder(opts DecodeOptions) (*skyDecoder, error) {
	schemas, err := skySchemas()
	if err != nil {
		return nil, err
	}
	d := &skyDecoder{common: common{opts}, withHeaders: schemas[0], withoutHeaders: schemas[1]}
	if opts.SchemaRegistry != "" {
		u, err := url.Parse(opts.SchemaRegistry)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("sky: schema registry %q is not an http or https URL", opts.SchemaRegistry)
		}
		d.registry = &skyRegistry{
			base:   u,
			client: &http.Client{Timeout: skyRegistryTimeout},
			byID:   map[uint32]*skyWriter{},
		}
	}
	return d, nil
}

// decode decodes the schedule r is, as KMS reads it. An error that is not a
// *RecordError (the schema registry unreachable, or answering 5xx) says
// nothing about the record: decoding it again later may succeed.
func (d *skyDecoder) decode(r *Record, id string) (Op, error) {
	s, err := d.decodeValue(r.Value)
	if err != nil {
		return Op{}, err
	}
	if s.Topic == "" {
		// Checked here for the hint: a wire-format value read bare decodes
		// as time 0, no topic, no key, a null value (its id's leading zero
		// bytes), whatever it holds.
		return Op{}, &RecordError{Field: "topic", Rule: "required" + d.wireHint(r.Value)}
	}
	ev := &chimev1.Event{
		DeliverAt: timestamppb.New(time.UnixMilli(s.Time)),
		Topic:     s.Topic,
		Key:       s.Key,
		// KMS keeps one schedule per key: a new record replaces it.
		OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE,
	}
	if s.Value == nil {
		ev.Tombstone = true
	} else {
		ev.Payload = *s.Value
	}
	if len(s.Headers) > 0 {
		// Avro leaves a map's order to the writer; sorted, the same schedule
		// is the same event, which idempotency compares.
		ev.Headers = make([]*chimev1.Header, 0, len(s.Headers)+1)
		for _, name := range slices.Sorted(maps.Keys(s.Headers)) {
			if hasChimePrefix(name) {
				return Op{}, &RecordError{Field: "headers", Rule: fmt.Sprintf("%q: the %q prefix is reserved for headers Chime adds", name, chimev1.HeaderPrefix)}
			}
			ev.Headers = append(ev.Headers, &chimev1.Header{Key: name, Value: s.Headers[name]})
		}
	}
	return d.schedule(r, id, ev), nil
}

// decodeValue decodes a record value: in the wire format with the writer
// schema the registry has, when a registry is set and the value is in it;
// otherwise as KMS does, with headers, then without.
func (d *skyDecoder) decodeValue(v []byte) (skySchedule, error) {
	var s skySchedule
	if d.registry != nil && len(v) >= 5 && v[0] == 0 {
		schemaID := binary.BigEndian.Uint32(v[1:5])
		w, err := d.registry.writer(schemaID)
		if err != nil {
			return s, err
		}
		if w.plainValue {
			var p skySchedulePlain
			err = skyRead(w.schema, v[5:], &p)
			s = skySchedule{Time: p.Time, Topic: p.Topic, Key: p.Key, Value: &p.Value, Headers: p.Headers}
		} else {
			err = skyRead(w.schema, v[5:], &s)
		}
		if err != nil {
			return s, &RecordError{Field: "value", Rule: fmt.Sprintf("%swith schema id %d: %v", skyNotAvro, schemaID, err)}
		}
		return s, nil
	}
	if skyRead(d.withHeaders, v, &s) == nil {
		return s, nil
	}
	// Both schemas start with the same four fields, so a body that fails
	// this too failed the first in the same place: this error is the one.
	s = skySchedule{}
	err := skyRead(d.withoutHeaders, v, &s)
	if err == nil {
		return s, nil
	}
	return s, &RecordError{Field: "value", Rule: skyNotAvro + err.Error() + d.wireHint(v)}
}

// wireHint is what to add to an error about value v when, read bare, it
// may be in the Confluent wire format instead: "" when it cannot be, or
// when the registry is set (then it was read as such).
func (d *skyDecoder) wireHint(v []byte) string {
	if d.registry != nil || len(v) < 5 || v[0] != 0 {
		return ""
	}
	return fmt.Sprintf(" (the value starts as the Confluent wire format would, with schema id %d: does the source need its schema registry?)",
		binary.BigEndian.Uint32(v[1:5]))
}

// skyRead decodes body with schema into s (a *skySchedule or a
// *skySchedulePlain). It fails wherever the body ends
// before the record does: avro.Unmarshal takes the end of its input for
// the end of a value, so a body cut short would decode as zero values (a
// time of 1970, no headers). Bytes after the record are ignored, as KMS
// ignores them.
func skyRead(schema avro.Schema, body []byte, s any) error {
	r := avro.NewReader(nil, 0, avro.WithReaderConfig(skyAPI(len(body)))).Reset(body)
	r.ReadVal(schema, s)
	if r.Error == nil {
		return nil
	}
	return skyReadError(r.Error, len(body))
}

// skyFields maps skySchedule's Go field names to the Avro ones.
var skyFields = map[string]string{"Time": "time", "Topic": "topic", "Key": "key", "Value": "value", "Headers": "headers"}

// skyReadError words a reader error on a body of n bytes for people who
// know the Avro schema, not this package's Go types. hamba wraps the
// reader's error in the Go name of the field being decoded, and in the Go
// type of a map: "Topic: avro: ReadSTRING: invalid string length" becomes
// `field "topic": invalid string length`.
func skyReadError(err error, n int) error {
	msg := err.Error()
	// A length past MaxByteSliceSize is a length past the body (skyAPI).
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(msg, "MaxByteSliceSize") {
		return fmt.Errorf("its %d bytes end inside the record", n)
	}
	field := ""
	if name, rest, ok := strings.Cut(msg, ": "); ok && skyFields[name] != "" {
		field, msg = skyFields[name], rest
	}
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	if field == "" {
		return errors.New(msg)
	}
	return fmt.Errorf("field %q: %s", field, msg)
}

// skyAPIs holds one avro.API per size class (see skyAPI).
var skyAPIs sync.Map // int (bits.Len of the body size) -> avro.API

// skyAPI is the configuration that decodes a body of n bytes. A bytes or
// string field of it cannot be longer than n, so the reader's bound on
// their lengths (MaxByteSliceSize: what a lying length makes it allocate
// before it finds the body short) is the power of two above n: at most
// twice the record, whatever it claims. hamba's default, 1 MiB, would
// reject larger payloads that KMS takes; no bound would let a ten-byte
// record claim a gigabyte. The class count is bounded by bits.UintSize.
func skyAPI(n int) avro.API {
	class := bits.Len(uint(n))
	if api, ok := skyAPIs.Load(class); ok {
		return api.(avro.API)
	}
	api, _ := skyAPIs.LoadOrStore(class, avro.Config{MaxByteSliceSize: 1 << class}.Freeze())
	return api.(avro.API)
}

// skyRegistry fetches writer schemas from a Confluent schema registry, by
// id, and keeps them: an id names one schema for good. What it keeps is
// the verdict on the schema, a sky schedule's or not; failures to fetch
// are not kept.
type skyRegistry struct {
	base   *url.URL
	client *http.Client

	mu   sync.Mutex
	byID map[uint32]*skyWriter // guarded by mu
}

// skyWriter is a writer schema of the registry, checked.
type skyWriter struct {
	schema avro.Schema
	// plainValue: the schema's value is "bytes", not a union with null.
	plainValue bool
	// err, when set, is why the schema cannot be read as a sky schedule:
	// the answer for every record that names it.
	err *RecordError
}

// writer returns the writer schema registered under id. A *RecordError is
// about the record (the id is unknown, or not of a sky schedule); any
// other error is the registry's, for now.
func (g *skyRegistry) writer(id uint32) (*skyWriter, error) {
	g.mu.Lock()
	w := g.byID[id]
	g.mu.Unlock()
	if w == nil {
		var err error
		if w, err = g.fetch(id); err != nil {
			return nil, err
		}
		g.mu.Lock()
		g.byID[id] = w
		g.mu.Unlock()
	}
	if w.err != nil {
		return nil, w.err
	}
	return w, nil
}

// fetch asks the registry for schema id: GET <base>/schemas/ids/<id>,
// answered {"schema": "<the schema's JSON>", "schemaType": "AVRO"} (the
// type absent for Avro).
func (g *skyRegistry) fetch(id uint32) (*skyWriter, error) {
	where := g.base.Redacted()
	u := g.base.JoinPath("schemas", "ids", strconv.FormatUint(uint64(id), 10))
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("sky: schema registry %s: %w", where, err)
	}
	req.Header.Set("Accept", "application/vnd.schemaregistry.v1+json, application/json")
	resp, err := g.client.Do(req) // the client's Timeout bounds it, body included
	if err != nil {
		return nil, fmt.Errorf("sky: schema registry %s: %w", where, err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end or abandoned: its error tells nothing more
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("sky: schema registry %s: schema id %d: %w", where, id, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, &RecordError{Field: "value", Rule: fmt.Sprintf("schema id %d is not in the schema registry %s", id, where)}
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("sky: schema registry %s: schema id %d: %s: %.200s", where, id, resp.Status, body)
	}
	var got struct {
		Schema     string `json:"schema"`
		SchemaType string `json:"schemaType"`
	}
	if err := json.Unmarshal(body, &got); err != nil || got.Schema == "" {
		return nil, fmt.Errorf("sky: schema registry %s: schema id %d: the answer is not {\"schema\": ...}: %.200s", where, id, body)
	}
	bad := func(format string, args ...any) *skyWriter {
		return &skyWriter{err: &RecordError{Field: "value", Rule: fmt.Sprintf("schema id %d ", id) + fmt.Sprintf(format, args...)}}
	}
	if got.SchemaType != "" && got.SchemaType != "AVRO" {
		return bad("is a %s schema, not Avro", got.SchemaType), nil
	}
	s, err := avro.ParseWithCache(got.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return bad("does not parse as an Avro schema: %v", err), nil
	}
	if why := skyCheckWriter(s); why != "" {
		return bad("is not a sky schedule: %s", why), nil
	}
	_, union := s.(*avro.RecordSchema).Fields()[skyFieldIndex(s, "value")].Type().(*avro.UnionSchema)
	return &skyWriter{schema: s, plainValue: !union}, nil
}

// skyFieldIndex is the position of the field name in the record schema s.
func skyFieldIndex(s avro.Schema, name string) int {
	return slices.IndexFunc(s.(*avro.RecordSchema).Fields(), func(f *avro.Field) bool { return f.Name() == name })
}

// skyCheckWriter says why a writer schema cannot be read as a sky schedule,
// or "" if it can: a record whose fields time, topic, key and value (and
// headers, if it has them) have the types of KMS's, in any order, other
// fields skipped. A field absent would decode as its zero value, and a
// time in another unit would move the schedule: both are refused here.
func skyCheckWriter(s avro.Schema) string {
	rec, ok := s.(*avro.RecordSchema)
	if !ok {
		return fmt.Sprintf("it is a %s, not a record", s.Type())
	}
	fields := map[string]avro.Schema{}
	for _, f := range rec.Fields() {
		fields[f.Name()] = f.Type()
	}
	isBytes := func(s avro.Schema) bool { return s.Type() == avro.Bytes && skyLogical(s) == "" }
	for _, want := range []struct {
		name, is string
		ok       func(avro.Schema) bool
	}{
		{"time", `"long" (or a timestamp-millis long)`, func(s avro.Schema) bool {
			l := skyLogical(s)
			return s.Type() == avro.Long && (l == "" || l == avro.TimestampMillis)
		}},
		{"topic", `"string"`, func(s avro.Schema) bool { return s.Type() == avro.String }},
		{"key", `"bytes"`, isBytes},
		{"value", `["null", "bytes"] (or "bytes")`, func(s avro.Schema) bool {
			u, ok := s.(*avro.UnionSchema)
			if !ok {
				return isBytes(s)
			}
			ts := u.Types()
			return len(ts) == 2 && u.Nullable() && (isBytes(ts[0]) || isBytes(ts[1]))
		}},
		{"headers", `a map of "bytes"`, func(s avro.Schema) bool {
			m, ok := s.(*avro.MapSchema)
			return ok && isBytes(m.Values())
		}},
	} {
		got, ok := fields[want.name]
		switch {
		case !ok && want.name == "headers":
		case !ok:
			return fmt.Sprintf("it has no field %q", want.name)
		case !want.ok(got):
			return fmt.Sprintf("field %q is %s, where sky's is %s", want.name, got.String(), want.is)
		}
	}
	return ""
}

// skyLogical is s's logical type, "" if none.
func skyLogical(s avro.Schema) avro.LogicalType {
	ls, ok := s.(avro.LogicalTypeSchema)
	if !ok || ls.Logical() == nil {
		return ""
	}
	return ls.Logical().Type()
}
