package rpc

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/cluster"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc/auth"
)

// Forecaster is a Backend that answers Forecast: it counts the pending
// events due in each range of series, summed over every shard,
// linearizably unless stale. A node's cluster.Cluster is one; a Backend
// that is not answers Forecast with UNIMPLEMENTED.
type Forecaster interface {
	Forecast(ctx context.Context, series []raftfsm.DueSeries, stale bool) (raftfsm.Forecast, error)
}

// Forecast counts the pending events due in consecutive ranges of time.
func (s *Server) Forecast(ctx context.Context, in *chimev1.ForecastRequest) (*chimev1.ForecastResponse, error) {
	series, err := cluster.ForecastSeries(in)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if g := auth.Scope(ctx); g != nil && !seesEverything(g) {
		return nil, status.Errorf(codes.PermissionDenied, "Forecast counts every pending event, and %q sees only some topics or id prefixes: count its own with Count and a due range (chimectl count --due-after ... --due-before ...)", g.Name)
	}
	fb, ok := s.backend.(Forecaster)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this node's backend keeps no forecast")
	}
	fc, err := fb.Forecast(ctx, series, in.GetStaleOk())
	if err != nil {
		return nil, s.backendStatus("Forecast", err)
	}
	return cluster.ForecastResponse(fc), nil
}

// seesEverything reports whether g reads every event, whatever its topic and
// id: an admin, or a grant of every topic ("*", or a reader's none) and no
// id prefixes. The authorizer's Scope also carries a grant limited only in
// its recurring schedules' min_interval, which a forecast need not refuse.
func seesEverything(g *auth.Grant) bool {
	switch {
	case g.Role == auth.RoleAdmin:
		return true
	case len(g.IDPrefixes) > 0:
		return false
	case len(g.Topics) == 0:
		return g.Role != auth.RoleScheduler
	}
	return slices.Contains(g.Topics, "*")
}
