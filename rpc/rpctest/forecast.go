package rpctest

import (
	"context"

	"github.com/chimehq/chime/raftfsm"
)

// Forecast implements rpc.Forecaster by counting the pending events' due
// times, as a node's shards count them.
func (b *Backend) Forecast(ctx context.Context, series []raftfsm.DueSeries, _ bool) (raftfsm.Forecast, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "Forecast"})
	if err := b.check(ctx); err != nil {
		return raftfsm.Forecast{}, err
	}
	fc := raftfsm.Forecast{Counts: make([][]uint64, len(series))}
	for i, s := range series {
		fc.Counts[i] = make([]uint64, s.Count)
	}
	for _, ev := range b.events {
		if ev.State != raftfsm.StateScheduled {
			continue
		}
		if fc.Pending == 0 || ev.Due < fc.Earliest {
			fc.Earliest = ev.Due
		}
		if fc.Pending == 0 || ev.Due > fc.Latest {
			fc.Latest = ev.Due
		}
		fc.Pending++
		if len(series) > 0 && ev.Due < series[0].Start {
			fc.Before++
		}
		for i, s := range series {
			if ev.Due >= s.Start && ev.Due < s.Start+int64(s.Count)*s.Step {
				fc.Counts[i][(ev.Due-s.Start)/s.Step]++
			}
		}
	}
	return fc, nil
}
