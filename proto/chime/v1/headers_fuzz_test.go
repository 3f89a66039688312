package chimev1

import (
	"strconv"
	"testing"
)

// FuzzParseHeaders: consumers parse the chime-* headers of records read from Kafka, where
// anyone with write access to a topic can put anything. ParseHeaders never panics; the
// headers as Chime's publisher writes them (publish.go: signed milliseconds, unsigned attempt
// and version) read back exactly, whatever header of the event's own comes before them; and
// a header alone is an error exactly when it is a numeric chime-* header whose value is not
// what the publisher could have written.
func FuzzParseHeaders(f *testing.F) {
	f.Add("order-42", int64(1_767_225_600_000), int64(1_767_225_600_250), uint32(1), uint64(3), HeaderVersion, []byte("7"))
	f.Add("", int64(0), int64(-1), uint32(0), uint64(1), HeaderDue, []byte("soon"))
	f.Add("x", int64(1), int64(2), uint32(2), uint64(0), HeaderAttempt, []byte("2"))
	f.Fuzz(func(t *testing.T, id string, due, fired int64, attempt uint32, version uint64, key string, val []byte) {
		hs := []header{
			{Key: key, Value: val},
			{Key: HeaderID, Value: []byte(id)},
			{Key: HeaderDue, Value: strconv.AppendInt(nil, due, 10)},
			{Key: HeaderFired, Value: strconv.AppendInt(nil, fired, 10)},
			{Key: HeaderAttempt, Value: strconv.AppendUint(nil, uint64(attempt), 10)},
			{Key: HeaderVersion, Value: strconv.AppendUint(nil, version, 10)},
		}
		got, err := ParseHeaders(hs[1:])
		want := Headers{ID: id, Due: msTime(due), Fired: msTime(fired), Attempt: int(attempt), Version: version}
		if err != nil || got != want {
			t.Fatalf("as written: %+v, %v; want %+v", got, err, want)
		}
		got, err = ParseHeaders(hs)
		if err != nil && !numeric(key) {
			t.Fatalf("header %q = %q before Chime's own: %v", key, val, err)
		}
		if got.ID != id || got.Due != want.Due || got.Fired != want.Fired || got.Attempt != want.Attempt || got.Version != version {
			t.Fatalf("header %q = %q before Chime's own: %+v, want %+v", key, val, got, want)
		}

		_, err = ParseHeaders(hs[:1])
		var bad bool
		switch key {
		case HeaderDue, HeaderFired:
			_, perr := strconv.ParseInt(string(val), 10, 64)
			bad = perr != nil
		case HeaderAttempt:
			_, perr := strconv.ParseUint(string(val), 10, strconv.IntSize-1)
			bad = perr != nil
		case HeaderVersion:
			_, perr := strconv.ParseUint(string(val), 10, 64)
			bad = perr != nil
		}
		if bad != (err != nil) {
			t.Fatalf("header %q = %q alone: %v", key, val, err)
		}
	})
}

func numeric(key string) bool {
	switch key {
	case HeaderDue, HeaderFired, HeaderAttempt, HeaderVersion:
		return true
	}
	return false
}
