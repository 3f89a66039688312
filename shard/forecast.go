package shard

import (
	"context"

	"github.com/chimehq/chime/raftfsm"
)

// Forecast counts the shard's pending events due in each range of series,
// from the counts by due minute its state machine keeps in memory;
// linearizable unless staleOK, as Count is.
func (s *Shard) Forecast(ctx context.Context, series []raftfsm.DueSeries, staleOK bool) (raftfsm.Forecast, error) {
	if err := s.queryable(ctx, staleOK); err != nil {
		return raftfsm.Forecast{}, err
	}
	return s.fsm.Forecast(series)
}
