package rpc

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
)

// FuzzPageToken: a List page token is client input, and may be anything. parsePageToken
// never panics and refuses with INVALID_ARGUMENT; a token it accepts names a position a shard
// query can carry to another node (a proto3 string must be UTF-8, or the forward fails as
// INTERNAL) with an id no longer than an event's, reads back from the token the server would issue for it, and is refused for a
// query it was not issued for.
//
// The fuzzer cannot forge the query hash a token carries, so each input is tried twice: as
// the token itself, and as tail, the bytes after the hash of a token made for the query
// (the due time, then the id), which reaches everything parsePageToken reads past the hash.
func FuzzPageToken(f *testing.F) {
	q := raftfsm.Query{Prefix: "order-", Topic: "payments", States: raftfsm.StatesOf(raftfsm.StateScheduled),
		Due: raftfsm.DueRange{From: -5, To: math.MaxInt64}}
	issued := pageToken(q, raftfsm.Position{Due: 1e18, ID: "order-42"})
	raw, _ := base64.RawURLEncoding.DecodeString(issued)
	f.Add(q.Prefix, q.Topic, uint8(q.States), q.Due.From, q.Due.To, issued, raw[9:])
	f.Add("", "", uint8(0), int64(math.MinInt64), int64(math.MaxInt64), "", []byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Add("", "", uint8(0), int64(0), int64(0), "garbage!", []byte("\x00\x00\x00\x00\x00\x00\x00\x01é"))
	f.Add("", "", uint8(0), int64(0), int64(0), "AQ", []byte{1})
	f.Fuzz(func(t *testing.T, prefix, topic string, states uint8, from, to int64, token string, tail []byte) {
		q := raftfsm.Query{Prefix: prefix, Topic: topic, States: raftfsm.StateSet(states), Due: raftfsm.DueRange{From: from, To: to}}
		checkPageToken(t, q, token)
		b := binary.BigEndian.AppendUint64([]byte{pageTokenVersion}, queryHash(q))
		checkPageToken(t, q, base64.RawURLEncoding.EncodeToString(append(b, tail...)))
	})
}

// maxID is the id limit the tokens are read with.
const maxID = 256

func checkPageToken(t *testing.T, q raftfsm.Query, token string) {
	p, err := parsePageToken(q, token, maxID)
	switch {
	case err != nil:
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("token %q refused with %v, not INVALID_ARGUMENT", token, err)
		}
	case token == "":
		if p != nil {
			t.Fatalf("no token reads as position %+v", *p)
		}
	default:
		if _, err := proto.Marshal(&chimev1.ShardQuery{AfterId: p.ID, AfterSet: true}); err != nil || len(p.ID) > maxID {
			t.Fatalf("token %q names id %q (%d bytes), which no shard query should carry: %v", token, p.ID, len(p.ID), err)
		}
		again, err := parsePageToken(q, pageToken(q, *p), maxID)
		if err != nil || *again != *p {
			t.Fatalf("token %q reads as %+v; issued again, as %+v, %v", token, *p, again, err)
		}
		other := q
		other.Prefix += "x"
		if _, err := parsePageToken(other, token, maxID); err == nil {
			t.Fatalf("token %q for %+v is accepted for %+v", token, q, other)
		}
	}
}
