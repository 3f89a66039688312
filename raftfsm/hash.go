package raftfsm

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// contentHashDomain starts every hashed encoding, so that this hash can never collide by
// construction with another use of xxhash over similar bytes, and so that a future change of
// the encoding can be told apart by a new domain string.
const contentHashDomain = "chime/content/v1\x00"

// ContentHash is the idempotency fingerprint of a schedule request: two requests with the same
// id are "the same" exactly when their ContentHash is equal (design invariant 6). The rpc layer
// computes it over the request as the client sent it, before resolving a relative delay into
// an absolute due time, so that a retry with the same delay matches the original.
//
// The hashed encoding is unambiguous: every variable-length field is length-prefixed, the
// header count is included, and the presence of deliverAt and delay is hashed as flags. A
// value whose have-flag is false is ignored. Nil and empty byte slices hash the same (the wire
// cannot tell them apart either). Header order matters, as it does in Kafka.
//
// The firing policy and the output are hashed only where they differ from the default (a
// priority other than DefaultPriority, a window; a partition, a tombstone), so an event
// without them hashes as it did before events had them.
//
// Changing this function changes the answer for every stored event: a re-send after an
// upgrade would be reported as a Conflict. Treat it as a stored format.
func ContentHash(topic string, key, payload []byte, headers []Header, deliverAtUnixNano int64, delayNanos int64, haveDeliverAt, haveDelay bool, p Policy, o Output) uint64 {
	var h contentHasher
	h.d.Reset()
	_, _ = h.d.WriteString(contentHashDomain)
	h.str(topic)
	h.bytes(key)
	h.bytes(payload)
	h.uvarint(uint64(len(headers)))
	for _, hd := range headers {
		h.str(hd.Key)
		h.bytes(hd.Value)
	}
	var flags byte
	if haveDeliverAt {
		flags |= 1
	}
	if haveDelay {
		flags |= 2
	}
	if p.Priority != DefaultPriority {
		flags |= 4
	}
	if p.Window != 0 {
		flags |= 8
	}
	if o.HasPartition {
		flags |= 16
	}
	if o.Tombstone {
		flags |= 32
	}
	h.buf[0] = flags
	_, _ = h.d.Write(h.buf[:1])
	if haveDeliverAt {
		h.fixed(uint64(deliverAtUnixNano))
	}
	if haveDelay {
		h.fixed(uint64(delayNanos))
	}
	if p.Priority != DefaultPriority {
		h.buf[0] = p.Priority
		_, _ = h.d.Write(h.buf[:1])
	}
	if p.Window != 0 {
		h.fixed(uint64(p.Window))
	}
	if o.HasPartition {
		h.fixed(uint64(o.Partition))
	}
	return h.d.Sum64()
}

// contentHasher feeds length prefixes through a stack buffer so hashing allocates nothing.
type contentHasher struct {
	d   xxhash.Digest
	buf [binary.MaxVarintLen64]byte
}

func (h *contentHasher) uvarint(v uint64) {
	n := binary.PutUvarint(h.buf[:], v)
	_, _ = h.d.Write(h.buf[:n])
}

func (h *contentHasher) fixed(v uint64) {
	binary.BigEndian.PutUint64(h.buf[:8], v)
	_, _ = h.d.Write(h.buf[:8])
}

func (h *contentHasher) str(s string) {
	h.uvarint(uint64(len(s)))
	_, _ = h.d.WriteString(s)
}

func (h *contentHasher) bytes(b []byte) {
	h.uvarint(uint64(len(b)))
	_, _ = h.d.Write(b)
}

// recurringHashDomain starts DefinitionHash's input, as contentHashDomain does ContentHash's.
const recurringHashDomain = "chime/recurring/v1\x00"

// DefinitionHash is the idempotency fingerprint of a recurring schedule's Create: a re-sent
// Create with an equal hash is the same schedule (RecurringExisting). It covers the rule and
// the target as the client sent them, and not MaxCatchUp, which the server sets. It is
// stored with the schedule: treat it as a stored format, as ContentHash.
func DefinitionHash(d *Definition) uint64 {
	var h contentHasher
	h.d.Reset()
	_, _ = h.d.WriteString(recurringHashDomain)
	h.str(d.Cron)
	h.fixed(uint64(d.Every))
	h.str(d.TimeZone)
	h.fixed(uint64(d.Start))
	h.fixed(uint64(d.End))
	h.fixed(uint64(d.Jitter))
	h.fixed(d.MaxOccurrences)
	h.uvarint(uint64(d.CatchUp))
	h.str(d.Topic)
	h.bytes(d.Key)
	h.bytes(d.Payload)
	h.uvarint(uint64(len(d.Headers)))
	for _, hd := range d.Headers {
		h.str(hd.Key)
		h.bytes(hd.Value)
	}
	h.uvarint(uint64(d.Priority))
	return h.d.Sum64()
}
