package client

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// ForecastSeries is Buckets consecutive ranges of due time, each Step long,
// the first starting at Start: [Start, Start+Step), [Start+Step,
// Start+2*Step), and so on. Start is a whole minute and Step whole minutes,
// the resolution at which nodes count pending events by due time.
type ForecastSeries struct {
	Start   time.Time
	Step    time.Duration
	Buckets int
}

// At returns where range i of the series starts.
func (s ForecastSeries) At(i int) time.Time { return s.Start.Add(time.Duration(i) * s.Step) }

// ForecastQuery is what a Forecast counts: 1 to 8 series of 1 to 1500
// ranges each.
type ForecastQuery struct {
	Series []ForecastSeries
	// StaleOK lets any replica answer from what it has applied.
	StaleOK bool
}

// ForecastAhead is the forecast of the time after now: per minute for the
// hour from the minute now is in, per hour for the day from its hour, and
// per day (UTC) for the 31 days from its day.
func ForecastAhead(now time.Time) ForecastQuery {
	return ForecastQuery{Series: []ForecastSeries{
		{Start: now.Truncate(time.Minute), Step: time.Minute, Buckets: 60},
		{Start: now.Truncate(time.Hour), Step: time.Hour, Buckets: 24},
		{Start: now.Truncate(24 * time.Hour), Step: 24 * time.Hour, Buckets: 31},
	}}
}

// ForecastCounts is a series and the pending events due in each of its
// ranges.
type ForecastCounts struct {
	ForecastSeries
	Counts []int64
}

// Forecast is how many pending events fall due in each range asked for.
type Forecast struct {
	// Series holds one ForecastCounts per series asked for, in order.
	Series []ForecastCounts
	// DueBefore is the pending events due before the first series' start:
	// overdue, when that is now.
	DueBefore int64
	// Pending is every pending event.
	Pending int64
	// EarliestDue and LatestDue are the due times of the first and the last
	// pending event; zero when none is pending.
	EarliestDue, LatestDue time.Time
}

// Forecast counts the pending events due in each range of q's series,
// across every shard. Each shard answers from counts by due minute it keeps
// in memory, so a forecast costs the same however many events are pending.
// It counts every event, whatever its topic or id: a credential limited to
// some topics or id prefixes gets ErrPermissionDenied (Count with a due
// range counts its own).
func (c *Client) Forecast(ctx context.Context, q ForecastQuery) (Forecast, error) {
	req := &chimev1.ForecastRequest{StaleOk: q.StaleOK}
	for _, s := range q.Series {
		req.Series = append(req.Series, &chimev1.ForecastSeries{Start: timestamppb.New(s.Start), Step: durationpb.New(s.Step), Buckets: uint32(max(0, s.Buckets))})
	}
	var resp *chimev1.ForecastResponse
	_, tried, err := c.call(ctx, "", false, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = chimev1.NewSchedulerClient(cc).Forecast(ctx, req)
		return err
	})
	if err != nil {
		return Forecast{}, finish("forecast", "", err, tried)
	}
	fc := Forecast{DueBefore: int64(resp.GetDueBefore()), Pending: int64(resp.GetPending())}
	for i, s := range resp.GetSeries() {
		fs := ForecastCounts{Counts: make([]int64, len(s.GetCounts()))}
		if i < len(q.Series) {
			fs.ForecastSeries = q.Series[i]
		}
		for j, n := range s.GetCounts() {
			fs.Counts[j] = int64(n)
		}
		fc.Series = append(fc.Series, fs)
	}
	if t := resp.GetEarliestDue(); t != nil {
		fc.EarliestDue = t.AsTime()
	}
	if t := resp.GetLatestDue(); t != nil {
		fc.LatestDue = t.AsTime()
	}
	return fc, nil
}
