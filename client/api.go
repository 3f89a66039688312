package client

import (
	"context"
	"iter"
)

// Scheduler is what a service does with Chime: *Client talks to a cluster,
// chimetest.Fake answers in memory on a virtual clock. Code that takes a
// Scheduler works with either.
type Scheduler interface {
	Schedule(ctx context.Context, ev Event, opts ...ScheduleOption) (Result, error)
	ScheduleBatch(ctx context.Context, evs []Event, opts ...ScheduleOption) ([]Result, error)
	Update(ctx context.Context, id string, opts ...UpdateOption) (Result, error)
	UpdateFunc(ctx context.Context, id string, fn func(*Event) error) (Result, error)
	Cancel(ctx context.Context, id string) error
	Get(ctx context.Context, id string) (Event, error)
	List(ctx context.Context, f Filter) iter.Seq2[Event, error]
	Count(ctx context.Context, f Filter) (int64, error)
	CancelMatching(ctx context.Context, f Filter, opts ...CancelMatchingOption) (CancelMatchingResult, error)
	Recurring() *Recurring
}
