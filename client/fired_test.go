package client_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/client"
)

// The times of the headers below: 2026-01-01T00:00:00Z, and 12 ms later.
var (
	parseDue   = time.UnixMilli(1_767_225_600_000)
	parseFired = parseDue.Add(12 * time.Millisecond)
)

func TestParseFiredKafkaGo(t *testing.T) {
	hs := []kafka.Header{
		{Key: "trace", Value: []byte("abc")},
		{Key: "chime-id", Value: []byte("order-42")},
		{Key: "chime-due-unix-ms", Value: []byte("1767225600000")},
		{Key: "chime-fired-unix-ms", Value: []byte("1767225600012")},
		{Key: "chime-attempt", Value: []byte("2")},
		{Key: "chime-version", Value: []byte("3")},
	}
	f, err := client.ParseFired(hs)
	if err != nil {
		t.Fatal(err)
	}
	want := client.Fired{ID: "order-42", Version: 3, Due: parseDue, FiredAt: parseFired, Attempt: 2}
	if f != want {
		t.Fatalf("got %+v\nwant %+v", f, want)
	}
	if f.Late() != 12*time.Millisecond {
		t.Errorf("Late = %v, want 12ms", f.Late())
	}
}

func TestParseFiredFranzGo(t *testing.T) {
	hs := []kgo.RecordHeader{
		{Key: "chime-id", Value: []byte("report@1767225600000")},
		{Key: "chime-due-unix-ms", Value: []byte("1767225600000")},
		{Key: "chime-fired-unix-ms", Value: []byte("1767225600012")},
		{Key: "chime-attempt", Value: []byte("1")},
		{Key: "chime-version", Value: []byte("1")},
		{Key: "chime-recurring-id", Value: []byte("report")},
		{Key: "chime-occurrence-unix-ms", Value: []byte("1767225600000")},
	}
	f, err := client.ParseFired(hs)
	if err != nil {
		t.Fatal(err)
	}
	want := client.Fired{ID: "report@1767225600000", Version: 1, Due: parseDue, FiredAt: parseFired, Attempt: 1,
		RecurringID: "report", Occurrence: parseDue}
	if f != want {
		t.Fatalf("got %+v\nwant %+v", f, want)
	}
}

func TestParseFiredClientHeaders(t *testing.T) {
	f, err := client.ParseFired([]client.Header{{Key: "chime-id", Value: []byte("x")}})
	if err != nil || f.ID != "x" || !f.Due.IsZero() || f.Late() != 0 {
		t.Fatalf("got %+v, %v", f, err)
	}
}

func TestParseFiredErrors(t *testing.T) {
	if _, err := client.ParseFired([]kgo.RecordHeader{{Key: "trace", Value: []byte("abc")}}); !errors.Is(err, client.ErrNotFired) {
		t.Errorf("no chime-id: %v, want ErrNotFired", err)
	}
	if _, err := client.ParseFired[kgo.RecordHeader](nil); !errors.Is(err, client.ErrNotFired) {
		t.Errorf("no headers: %v, want ErrNotFired", err)
	}
	f, err := client.ParseFired([]kgo.RecordHeader{
		{Key: "chime-id", Value: []byte("a")},
		{Key: "chime-version", Value: []byte("-1")},
		{Key: "chime-attempt", Value: []byte("4")},
	})
	if err == nil || errors.Is(err, client.ErrNotFired) {
		t.Errorf("bad version: %v, want a parse error", err)
	}
	if f.ID != "a" || f.Version != 0 || f.Attempt != 4 {
		t.Errorf("bad version: got %+v; want the other fields filled", f)
	}
}

func TestDeduper(t *testing.T) {
	d := client.NewDeduper(3)
	rec := func(id string, v uint64) client.Fired { return client.Fired{ID: id, Version: v} }
	for _, step := range []struct {
		f    client.Fired
		seen bool
	}{
		{rec("a", 1), false},
		{rec("a", 1), true},
		{rec("a", 2), false}, // a new version is a new record
		{rec("b", 1), false},
		{rec("a", 1), true},  // a duplicate does not take a slot
		{rec("c", 1), false}, // evicts a/1, the oldest
		{rec("a", 2), true},
		{rec("a", 1), false}, // forgotten: 3 records came since; it evicts a/2
		{rec("a", 2), false},
	} {
		if got := d.Seen(step.f); got != step.seen {
			t.Fatalf("Seen(%s/%d) = %v, want %v", step.f.ID, step.f.Version, got, step.seen)
		}
	}
}

func TestDeduperConcurrent(t *testing.T) {
	d := client.NewDeduper(1000)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first = map[string]int{}
	)
	for range 8 {
		wg.Go(func() {
			for i := range 100 {
				id := fmt.Sprint(i)
				if !d.Seen(client.Fired{ID: id, Version: 1}) {
					mu.Lock()
					first[id]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for i := range 100 {
		if n := first[fmt.Sprint(i)]; n != 1 {
			t.Errorf("id %d was new to %d goroutines, want 1", i, n)
		}
	}
}

func TestNewDeduperPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("NewDeduper(0) did not panic")
		}
	}()
	client.NewDeduper(0)
}
