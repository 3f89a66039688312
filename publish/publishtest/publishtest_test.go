package publishtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func record(id, attempt string) *kgo.Record {
	return &kgo.Record{Topic: "t", Value: []byte("v-" + id), Headers: []kgo.RecordHeader{
		{Key: "chime-id", Value: []byte(id)}, {Key: "chime-attempt", Value: []byte(attempt)}}}
}

// TestConsumeCountsDuplicates produces two ids, one of them twice, and one
// record with a malformed header.
func TestConsumeCountsDuplicates(t *testing.T) {
	b := NewBroker(t)
	p, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.ProduceSync(ctx, record("a", "1"), record("b", "1"), record("a", "2"), record("c", "x")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got := Consume(t, b.Addrs(), 3, 20*time.Second, "t")
	if len(got.Records) != 4 || len(got.ByID) != 3 || got.Dups != 1 {
		t.Fatalf("read %d records, %d ids, %d duplicates; want 4, 3, 1", len(got.Records), len(got.ByID), got.Dups)
	}
	if a := got.ByID["a"]; a.Attempt != 1 || a.Value() != "v-a" || a.HeaderErr != nil {
		t.Errorf("a: attempt %d, value %q, err %v; want the first copy", a.Attempt, a.Value(), a.HeaderErr)
	}
	if v, ok := got.ByID["b"].Header("chime-attempt"); !ok || v != "1" {
		t.Errorf("b: chime-attempt header %q %v", v, ok)
	}
	if got.ByID["c"].HeaderErr == nil {
		t.Error("c: a malformed chime-attempt parsed without an error")
	}
}

// TestHoldAndRefuse: a held broker answers nothing until released, and a
// refusing one answers every produce with the error.
func TestHoldAndRefuse(t *testing.T) {
	b := NewBroker(t)
	p, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.AllowAutoTopicCreation(), kgo.RecordRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	produce := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return p.ProduceSync(ctx, record("a", "1")).FirstErr()
	}
	if err := produce(20 * time.Second); err != nil {
		t.Fatal(err)
	}

	b.Hold()
	held := make(chan error, 1)
	p.Produce(context.Background(), record("b", "1"), func(_ *kgo.Record, err error) { held <- err })
	select {
	case err := <-held:
		t.Fatalf("a held broker answered a produce: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	b.Release()
	select {
	case err := <-held:
		if err != nil {
			t.Fatalf("the held produce, after the release: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the held produce was not answered within 20 s of the release")
	}

	b.RefuseProduce(kerr.InvalidRecord.Code)
	if err := produce(20 * time.Second); !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("produce to a refusing broker: %v, want %v", err, kerr.InvalidRecord)
	}
	if b.Refused() == 0 {
		t.Error("Refused is 0 after a refused produce")
	}
	b.AcceptProduce()
	if err := produce(20 * time.Second); err != nil {
		t.Fatalf("produce after AcceptProduce: %v", err)
	}
}

func TestWaitFor(t *testing.T) {
	n := 0
	WaitFor(t, 10*time.Second, "n reaches 3", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("WaitFor returned after %d polls, want 3", n)
	}
}
