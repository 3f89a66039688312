package main

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// appendLog records when the broker (in this process) received each record,
// on the history's clock. A record's own timestamp is the producer's clock,
// which the skew nemesis moves, and kfake applies LogAppendTime only when
// the producer asks for it; so the time a record reached Kafka is taken
// here, from the produce request, before the broker handles it.
type appendLog struct {
	mu sync.Mutex
	at map[appendKey]int64 // unix ns of the first produce request carrying the record
}

// appendKey names one produced copy: an id is produced again only by a
// retry (another chime-attempt) or another firing (another
// chime-fired-unix-ms).
type appendKey struct {
	topic, id string
	firedMs   int64
	attempt   int
}

// keyOf names the copy a record with headers h on topic is.
func keyOf(topic string, h chimev1.Headers) appendKey {
	k := appendKey{topic: topic, id: h.ID, attempt: h.Attempt}
	if !h.Fired.IsZero() {
		k.firedMs = h.Fired.UnixMilli()
	}
	return k
}

func watchProduces(c *kfake.Cluster) *appendLog {
	l := &appendLog{at: map[appendKey]int64{}}
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		now := time.Now().UnixNano()
		pr, ok := req.(*kmsg.ProduceRequest)
		if !ok {
			return nil, nil, false
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, t := range pr.Topics {
			for _, p := range t.Partitions {
				eachRecord(p.Records, func(r *kmsg.Record) {
					h, _ := chimev1.ParseHeaders(r.Headers) // a malformed header leaves its field zero
					k := keyOf(t.Topic, h)
					if _, seen := l.at[k]; !seen {
						l.at[k] = now
					}
				})
			}
		}
		return nil, nil, false // not handled: the broker goes on as usual
	})
	return l
}

func (l *appendLog) lookup(k appendKey) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.at[k]
	return t, ok
}

// eachRecord walks the record batches of a produce request. Compressed
// batches are skipped (Chime's producer does not compress).
func eachRecord(buf []byte, fn func(*kmsg.Record)) {
	for len(buf) >= 12 {
		n := 12 + int(binary.BigEndian.Uint32(buf[8:12]))
		if n > len(buf) {
			return
		}
		var b kmsg.RecordBatch
		if err := b.ReadFrom(buf[:n]); err != nil || b.Attributes&0x07 != 0 {
			buf = buf[n:]
			continue
		}
		recs := b.Records
		for i := int32(0); i < b.NumRecords && len(recs) > 0; i++ {
			l, w := binary.Varint(recs)
			if w <= 0 || int(l)+w > len(recs) {
				break
			}
			var r kmsg.Record
			if r.ReadFrom(recs[:w+int(l)]) == nil {
				fn(&r)
			}
			recs = recs[w+int(l):]
		}
		buf = buf[n:]
	}
}
