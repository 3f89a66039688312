// Package publishtest is the test kit for code that produces to Kafka: a
// Kafka-protocol broker on loopback for one test, which can hold or refuse
// its traffic, and one consumer that reads topics back with an independent
// client (franz-go) and parses the chime-* headers with chimev1.ParseHeaders.
// For brokers behind TLS it has a throwaway certificate authority (CA), made
// in memory for one test.
//
// It is for tests only: every broker and consumer it starts belongs to a
// testing.TB and stops in that test's Cleanup, so no goroutine of this
// package outlives the test that started it. It never asserts anything about
// what it read: the test decides what the records must say.
package publishtest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Broker is a kfake Kafka-protocol broker on loopback, closed when the test
// ends. The embedded Cluster gives tests the rest of kfake (ControlKey,
// CreateTopic...).
type Broker struct {
	*kfake.Cluster
	gate    gate
	refuse  atomic.Int32 // the produce error code answered while refusing; 0 accepts
	refused atomic.Int64 // produce requests refused so far
}

// NewBroker starts one broker that creates topics of 3 partitions on first
// use; opts come after those defaults and override them (a ListenFn among
// them disables Hold). The broker closes in t's Cleanup.
func NewBroker(t testing.TB, opts ...kfake.Opt) *Broker {
	t.Helper()
	b := &Broker{}
	b.gate.open = make(chan struct{})
	close(b.gate.open)
	base := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			ln, err := net.Listen(network, addr)
			if err != nil {
				return nil, err
			}
			return gatedListener{ln, &b.gate}, nil
		})}
	c, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	b.Cluster = c
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		code := int16(b.refuse.Load())
		if code == 0 {
			return nil, nil, false
		}
		c.KeepControl()
		b.refused.Add(1)
		return FailProduce(req, code), nil, true
	})
	// A held connection blocks in Read until the gate opens: open it so
	// that Close can end the broker's connections.
	t.Cleanup(func() { b.Release(); c.Close() })
	return b
}

// Addrs are the broker's listen addresses, for publish.Config.Brokers.
func (b *Broker) Addrs() []string { return b.ListenAddrs() }

// Hold stops the broker's traffic the way a network that drops packets
// does: requests sit in socket buffers and reach the broker when Release is
// called, long after the client may have given up on them. Connections stay
// open.
func (b *Broker) Hold() { b.gate.shut() }

// Release lets held traffic through.
func (b *Broker) Release() { b.gate.release() }

// RefuseProduce answers every produce request with code on every partition
// (e.g. kerr.NotEnoughReplicas.Code: a Kafka cut off from its replicas)
// until AcceptProduce; code 0 accepts.
func (b *Broker) RefuseProduce(code int16) { b.refuse.Store(int32(code)) }

// AcceptProduce ends RefuseProduce.
func (b *Broker) AcceptProduce() { b.refuse.Store(0) }

// Refused is how many produce requests RefuseProduce answered.
func (b *Broker) Refused() int64 { return b.refused.Load() }

// FailProduce answers every partition of a produce request with code, for
// kfake control functions.
func FailProduce(kreq kmsg.Request, code int16) kmsg.Response {
	req := kreq.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// gate holds a broker's traffic while it is shut.
type gate struct {
	mu     sync.Mutex
	closed bool
	open   chan struct{} // closed while open
}

func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed, g.open = true, make(chan struct{})
	}
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.open)
	}
}

func (g *gate) wait() {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	<-ch
}

type gatedListener struct {
	net.Listener
	g *gate
}

func (l gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return gatedConn{c, l.g}, nil
}

type gatedConn struct {
	net.Conn
	g *gate
}

// Read hands bytes to the broker only while the gate is open, including
// bytes that arrived just before it shut.
func (c gatedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.g.wait()
	return n, err
}

func (c gatedConn) Write(p []byte) (int, error) {
	c.g.wait()
	return c.Conn.Write(p)
}

// Record is one record as an independent client read it.
type Record struct {
	chimev1.Headers             // its chime-* headers, parsed
	HeaderErr       error       // what chimev1.ParseHeaders said of them
	Kafka           *kgo.Record // the record itself: topic, partition, offset, key, value, every header
	Received        time.Time   // when the consumer read it
}

// Value is the record's value as a string.
func (r Record) Value() string { return string(r.Kafka.Value) }

// Header is the value of the record's last header named key, and whether
// it has one.
func (r Record) Header(key string) (string, bool) {
	v, ok := "", false
	for _, h := range r.Kafka.Headers {
		if h.Key == key {
			v, ok = string(h.Value), true
		}
	}
	return v, ok
}

// Consumed is what a consumer read so far.
type Consumed struct {
	Records []Record          // every record, duplicates included, in the order read
	ByID    map[string]Record // the first record of each chime-id
	Dups    int               // records whose chime-id had been read before
}

// Collector reads topics from their start in the background until the test
// ends or Close is called.
type Collector struct {
	mu   sync.Mutex
	recs []Record
	stop context.CancelFunc
	done chan struct{}
}

// Collect starts a Collector of topics on the brokers at addrs. It stops in
// t's Cleanup.
func Collect(t testing.TB, addrs []string, topics ...string) *Collector {
	t.Helper()
	return CollectWith(t, []kgo.Opt{kgo.SeedBrokers(addrs...)}, topics...)
}

// CollectWith is Collect with the client's options given: the seed
// brokers, and how to reach them (kgo.DialTLSConfig, kgo.SASL) when the
// broker demands it.
func CollectWith(t testing.TB, opts []kgo.Opt, topics ...string) *Collector {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50 * time.Millisecond), kgo.MetadataMinAge(50 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Collector{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer cl.Close()
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				h, err := chimev1.ParseHeaders(r.Headers)
				c.mu.Lock()
				c.recs = append(c.recs, Record{Headers: h, HeaderErr: err, Kafka: r, Received: now})
				c.mu.Unlock()
			})
		}
	}()
	t.Cleanup(c.Close)
	return c
}

// Close stops the Collector and waits for its goroutine to end; what it
// read stays readable.
func (c *Collector) Close() { c.stop(); <-c.done }

// Consumed is what the Collector read so far.
func (c *Collector) Consumed() Consumed {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Consumed{Records: append([]Record(nil), c.recs...), ByID: make(map[string]Record, len(c.recs))}
	for _, r := range c.recs {
		if _, dup := out.ByID[r.ID]; dup {
			out.Dups++
			continue
		}
		out.ByID[r.ID] = r
	}
	return out
}

// WaitIDs waits until the Collector read want distinct chime-ids or d
// passed, and returns what it read: the caller checks it.
func (c *Collector) WaitIDs(want int, d time.Duration) Consumed {
	deadline := time.Now().Add(d)
	for {
		got := c.Consumed()
		if len(got.ByID) >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DupWindow is how long Consume keeps reading after the records it waited
// for arrived, so that copies produced right behind them are counted too.
const DupWindow = 300 * time.Millisecond

// Consume reads topics from their start until want distinct chime-ids
// arrived or d passed, reads for DupWindow more, and returns everything it
// read. It never fails the test on what it read: the caller checks.
func Consume(t testing.TB, addrs []string, want int, d time.Duration, topics ...string) Consumed {
	t.Helper()
	c := Collect(t, addrs, topics...)
	defer c.Close()
	if got := c.WaitIDs(want, d); len(got.ByID) < want {
		return got
	}
	// The records waited for are here; copies of them are what is left to see.
	time.Sleep(DupWindow)
	return c.Consumed()
}

// WaitFor polls cond every 10 ms until it holds, and fails the test if it
// does not within d. A poll returns as soon as cond holds, so d should be
// generous (10-30 s): it bounds a failure, not the test's duration.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
