package cluster

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// Bounds of a Forecast request: enough for a month of days, a day of hours
// and an hour of minutes in one call, and a little more.
const (
	MaxForecastSeries  = 8
	MaxForecastBuckets = 1500
)

// ForecastSeries turns a Forecast request's series into the ranges they
// stand for. Its errors name the field and the rule it broke.
func ForecastSeries(req *chimev1.ForecastRequest) ([]raftfsm.DueSeries, error) {
	in := req.GetSeries()
	if len(in) == 0 || len(in) > MaxForecastSeries {
		return nil, fmt.Errorf("series: 1 to %d series, got %d", MaxForecastSeries, len(in))
	}
	out := make([]raftfsm.DueSeries, len(in))
	for i, s := range in {
		at := fmt.Sprintf("series[%d]", i)
		if err := s.GetStart().CheckValid(); err != nil {
			return nil, fmt.Errorf("%s.start: %v", at, err)
		}
		if s.GetStart().GetSeconds()%60 != 0 || s.GetStart().GetNanos() != 0 {
			return nil, fmt.Errorf("%s.start: %s is not a whole minute", at, s.GetStart().AsTime().Format(time.RFC3339Nano))
		}
		if err := s.GetStep().CheckValid(); err != nil {
			return nil, fmt.Errorf("%s.step: %v", at, err)
		}
		step := s.GetStep().AsDuration()
		if step < time.Minute || step%time.Minute != 0 {
			return nil, fmt.Errorf("%s.step: %s is not a whole number of minutes (at least 1m)", at, step)
		}
		if s.GetBuckets() < 1 || s.GetBuckets() > MaxForecastBuckets {
			return nil, fmt.Errorf("%s.buckets: 1 to %d, got %d", at, MaxForecastBuckets, s.GetBuckets())
		}
		ds := raftfsm.DueSeries{Start: s.GetStart().AsTime().UnixNano(), Step: int64(step), Count: int(s.GetBuckets())}
		// Beyond the nanoseconds an int64 holds (1677 to 2262) is no event's due time.
		if sec := s.GetStart().GetSeconds(); sec < -9_223_372_036 || sec > 9_223_372_036 ||
			time.Duration(ds.Count)*step/time.Duration(ds.Count) != step || ds.Start+int64(ds.Count)*ds.Step < ds.Start {
			return nil, fmt.Errorf("%s: its ranges end past 2262, the last due time an event can have", at)
		}
		out[i] = ds
	}
	return out, nil
}

// ForecastRequest is the request that asks for series.
func ForecastRequest(series []raftfsm.DueSeries, stale bool) *chimev1.ForecastRequest {
	req := &chimev1.ForecastRequest{StaleOk: stale}
	for _, s := range series {
		req.Series = append(req.Series, &chimev1.ForecastSeries{Start: timestamppb.New(time.Unix(0, s.Start)),
			Step: durationpb.New(time.Duration(s.Step)), Buckets: uint32(s.Count)})
	}
	return req
}

// ForecastResponse is fc as the API returns it.
func ForecastResponse(fc raftfsm.Forecast) *chimev1.ForecastResponse {
	resp := &chimev1.ForecastResponse{DueBefore: fc.Before, Pending: fc.Pending}
	for _, c := range fc.Counts {
		resp.Series = append(resp.Series, &chimev1.ForecastCounts{Counts: c})
	}
	if fc.Pending > 0 {
		resp.EarliestDue, resp.LatestDue = timestamppb.New(time.Unix(0, fc.Earliest)), timestamppb.New(time.Unix(0, fc.Latest))
	}
	return resp
}

// forecastFrom reads a shard's answer to series from a peer.
func forecastFrom(resp *chimev1.ForecastResponse, series []raftfsm.DueSeries) (raftfsm.Forecast, error) {
	fc := raftfsm.Forecast{Before: resp.GetDueBefore(), Pending: resp.GetPending(), Counts: make([][]uint64, len(series))}
	if len(resp.GetSeries()) != len(series) {
		return fc, fmt.Errorf("a peer answered a forecast of %d series with %d", len(series), len(resp.GetSeries()))
	}
	for i, s := range resp.GetSeries() {
		if len(s.GetCounts()) != series[i].Count {
			return fc, fmt.Errorf("a peer answered series %d of %d ranges with %d", i, series[i].Count, len(s.GetCounts()))
		}
		fc.Counts[i] = s.GetCounts()
	}
	if fc.Pending > 0 {
		fc.Earliest, fc.Latest = resp.GetEarliestDue().AsTime().UnixNano(), resp.GetLatestDue().AsTime().UnixNano()
	}
	return fc, nil
}

// Forecast counts the pending events due in each range of series, summed
// over every shard, each shard's part answered by its leader (any replica
// with stale) from its counts by due minute.
func (c *Cluster) Forecast(ctx context.Context, series []raftfsm.DueSeries, stale bool) (raftfsm.Forecast, error) {
	parts := make([]raftfsm.Forecast, c.shards)
	err := eachShard(ctx, c.shards, func(ctx context.Context, s uint32) (err error) {
		parts[s], err = on(ctx, c, s, stale, nil,
			func(r *shard.Shard) (raftfsm.Forecast, error) { return r.Forecast(ctx, series, stale) },
			func(ctx context.Context, p chimev1.PeerClient) (raftfsm.Forecast, error) {
				resp, err := p.ShardForecast(ctx, &chimev1.ShardForecastRequest{Shard: s, Request: ForecastRequest(series, stale)})
				if err != nil {
					return raftfsm.Forecast{}, err
				}
				return forecastFrom(resp, series)
			})
		return err
	})
	if err != nil {
		return raftfsm.Forecast{}, err
	}
	return mergeForecasts(parts, series), nil
}

// mergeForecasts sums the shards' forecasts of series.
func mergeForecasts(parts []raftfsm.Forecast, series []raftfsm.DueSeries) raftfsm.Forecast {
	fc := raftfsm.Forecast{Counts: make([][]uint64, len(series))}
	for i, s := range series {
		fc.Counts[i] = make([]uint64, s.Count)
	}
	for _, p := range parts {
		for i := range p.Counts {
			for j, n := range p.Counts[i] {
				fc.Counts[i][j] += n
			}
		}
		fc.Before += p.Before
		if p.Pending == 0 {
			continue
		}
		if fc.Pending == 0 || p.Earliest < fc.Earliest {
			fc.Earliest = p.Earliest
		}
		if fc.Pending == 0 || p.Latest > fc.Latest {
			fc.Latest = p.Latest
		}
		fc.Pending += p.Pending
	}
	return fc
}

// ShardForecast is one shard's part of a Forecast, on this node's replica.
func (p peerServer) ShardForecast(ctx context.Context, req *chimev1.ShardForecastRequest) (*chimev1.ForecastResponse, error) {
	series, err := ForecastSeries(req.GetRequest())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	r, err := p.replica(req.GetShard())
	if err != nil {
		return nil, err
	}
	fc, err := r.Forecast(ctx, series, req.GetRequest().GetStaleOk())
	if err != nil {
		return nil, StatusOf(p.c.logger, "Forecast", err)
	}
	return ForecastResponse(fc), nil
}
