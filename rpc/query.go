package rpc

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"time"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/chimehq/chime/cluster"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// List page sizes: the default, and the most one page may ask for.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// maxPageBytes bounds a List page's encoded size below gRPC's default 4 MiB
// message limit, which clients receive with: a page of large events ends
// early, with a token for the rest.
const maxPageBytes = 3 << 20

// cancelProgressEvery is how often CancelMatching reports its running totals.
const cancelProgressEvery = 250 * time.Millisecond

// checkFilter validates a filter and returns the query it stands for.
func (s *Server) checkFilter(f *chimev1.EventFilter) (raftfsm.Query, error) {
	if n := len(f.GetIdPrefix()); n > s.limits.MaxIDBytes {
		return raftfsm.Query{}, invalidArgument("filter.id_prefix", "%d bytes, at most %d allowed", n, s.limits.MaxIDBytes)
	}
	q, err := cluster.FilterQuery(f)
	if err != nil {
		return raftfsm.Query{}, status.Error(codes.InvalidArgument, err.Error())
	}
	return q, nil
}

// invalidArgument is the INVALID_ARGUMENT status naming path and its rule.
func invalidArgument(path, format string, args ...any) error {
	return status.Error(codes.InvalidArgument, invalid(path, format, args...).Error())
}

// A page token is the position of the last event a page returned, and a
// hash of the query it belongs to: base64url(version 1 | hash u64 | due
// i64 | id). It holds no state on any node, so it stays valid on any node
// and across leader changes; a token given with another query is refused
// rather than silently continuing a different list.
const pageTokenVersion = 1

func queryHash(q raftfsm.Query) uint64 {
	b := binary.AppendUvarint(nil, uint64(len(q.Prefix)))
	b = append(b, q.Prefix...)
	b = binary.AppendUvarint(b, uint64(len(q.Topic)))
	b = append(b, q.Topic...)
	b = append(b, byte(q.States))
	b = binary.BigEndian.AppendUint64(b, uint64(q.Due.From))
	b = binary.BigEndian.AppendUint64(b, uint64(q.Due.To))
	if q.Priorities != 0 {
		// Appended only when set, so that a token issued before priorities existed, for a
		// query without them, still continues its list.
		b = binary.BigEndian.AppendUint16(b, uint16(q.Priorities))
	}
	return xxhash.Sum64(b)
}

func pageToken(q raftfsm.Query, p raftfsm.Position) string {
	b := []byte{pageTokenVersion}
	b = binary.BigEndian.AppendUint64(b, queryHash(q))
	b = binary.BigEndian.AppendUint64(b, uint64(p.Due))
	return base64.RawURLEncoding.EncodeToString(append(b, p.ID...))
}

// parsePageToken reads a token List issued for q. The id in it was an event's, so it is
// UTF-8 and at most maxID bytes: a token whose id is not is refused as not issued here, before
// the position travels to other nodes in a shard query, whose proto3 string field would refuse
// the bytes (an INTERNAL error for what is the client's), or whose size the id would swell.
func parsePageToken(q raftfsm.Query, token string, maxID int) (*raftfsm.Position, error) {
	if token == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) < 17 || b[0] != pageTokenVersion || len(b)-17 > maxID || !utf8.Valid(b[17:]) {
		return nil, invalidArgument("page_token", "not a token this server issued")
	}
	if binary.BigEndian.Uint64(b[1:]) != queryHash(q) {
		return nil, invalidArgument("page_token", "issued for another query: give the same filter as the page it came from, or no token to start over")
	}
	return &raftfsm.Position{Due: int64(binary.BigEndian.Uint64(b[9:])), ID: string(b[17:])}, nil
}

// listLimit is a List's page size: defaultListLimit for 0, at most maxListLimit.
func listLimit(limit uint32) (int, error) {
	switch {
	case limit == 0:
		return defaultListLimit, nil
	case limit > maxListLimit:
		return 0, invalidArgument("limit", "%d, at most %d allowed", limit, maxListLimit)
	}
	return int(limit), nil
}

// List returns a page of the events a filter selects.
func (s *Server) List(ctx context.Context, in *chimev1.ListRequest) (*chimev1.ListResponse, error) {
	q, err := s.checkFilter(in.GetFilter())
	if err != nil {
		return nil, err
	}
	limit, err := listLimit(in.GetLimit())
	if err != nil {
		return nil, err
	}
	after, err := parsePageToken(q, in.GetPageToken(), s.limits.MaxIDBytes)
	if err != nil {
		return nil, err
	}
	recs, truncated, err := s.backend.List(ctx, q, after, limit+1, in.GetStaleOk())
	if err != nil {
		return nil, s.backendStatus("List", err)
	}
	resp := &chimev1.ListResponse{}
	size := 0
	for i := range recs {
		if i == limit {
			break
		}
		g, err := cluster.GetResponse(&recs[i])
		if err != nil {
			return nil, s.backendStatus("List", err)
		}
		if size += proto.Size(g); size > maxPageBytes && i > 0 {
			break
		}
		resp.Events = append(resp.Events, g)
	}
	if n := len(resp.Events); n > 0 && (n < len(recs) || truncated) {
		last := &recs[n-1]
		resp.NextPageToken = pageToken(q, raftfsm.Position{Due: last.Due, ID: last.ID})
	}
	return resp, nil
}

// Count returns how many events a filter selects.
func (s *Server) Count(ctx context.Context, in *chimev1.CountRequest) (*chimev1.CountResponse, error) {
	q, err := s.checkFilter(in.GetFilter())
	if err != nil {
		return nil, err
	}
	n, err := s.backend.Count(ctx, q, in.GetStaleOk())
	if err != nil {
		return nil, s.backendStatus("Count", err)
	}
	return &chimev1.CountResponse{Count: n}, nil
}

// CancelMatching cancels the pending events a filter selects and streams the
// running totals.
func (s *Server) CancelMatching(in *chimev1.CancelMatchingRequest, stream grpc.ServerStreamingServer[chimev1.CancelMatchingProgress]) error {
	f := in.GetFilter()
	q, err := s.checkFilter(f)
	if err != nil {
		return err
	}
	if q.States != 0 && !q.States.OnlyPending() {
		return invalidArgument("filter.states", "CancelMatching cancels pending events only: leave states empty or give SCHEDULED alone")
	}
	if q.Prefix == "" && q.Topic == "" && f.GetDueAfter() == nil && f.GetDueBefore() == nil {
		if q.Priorities != 0 {
			return invalidArgument("filter", "priorities alone select too much for a bulk cancel; give an id_prefix, a topic or a due range as well (to cancel every pending event of these priorities, a due range that covers them all)")
		}
		return invalidArgument("filter", "empty; give an id_prefix, a topic or a due range (to cancel every pending event, a due range that covers them all)")
	}
	var (
		total    chimev1.CancelMatchingProgress
		lastSent time.Time
		sendErr  error
	)
	err = s.backend.CancelMatching(stream.Context(), q, in.GetDryRun(), func(step shard.CancelStep) {
		total.Matched += step.Matched
		total.Cancelled += step.Cancelled
		total.SkippedFired += step.Fired
		total.SkippedHeld += step.Held
		if sendErr == nil && time.Since(lastSent) >= cancelProgressEvery {
			lastSent = time.Now()
			sendErr = stream.Send(proto.Clone(&total).(*chimev1.CancelMatchingProgress))
		}
	})
	if err == nil {
		err = sendErr
	}
	if err != nil {
		st := status.Convert(s.backendStatus("CancelMatching", err))
		return status.Errorf(st.Code(), "%s (%d matched and %d cancelled before it stopped: run it again to finish)", st.Message(), total.Matched, total.Cancelled)
	}
	total.Done = true
	return stream.Send(&total)
}
