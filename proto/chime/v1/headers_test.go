package chimev1

import (
	"strings"
	"testing"
)

// header is a client's header type as ParseHeaders accepts it; the Kafka
// clients' own types are tested in package publish, which links them.
type header struct {
	Key   string
	Value []byte
}

func TestParseHeadersNamesAMalformedHeader(t *testing.T) {
	got, err := ParseHeaders([]header{
		{Key: HeaderID, Value: []byte("x")},
		{Key: HeaderDue, Value: []byte("soon")},
		{Key: HeaderAttempt, Value: []byte("2")},
	})
	if err == nil || !strings.Contains(err.Error(), HeaderDue) || !strings.Contains(err.Error(), `"soon"`) {
		t.Errorf("error %v does not name %s and its value", err, HeaderDue)
	}
	if got.ID != "x" || got.Attempt != 2 || !got.Due.IsZero() {
		t.Errorf("the well-formed headers were not kept: %+v", got)
	}
	if _, ok := got.Late(); ok {
		t.Error("Late is known without a due time")
	}
	if got, err := ParseHeaders[header](nil); err != nil || got != (Headers{}) {
		t.Errorf("no headers: %+v, %v", got, err)
	}
}
