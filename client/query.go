package client

import (
	"context"
	"io"
	"iter"
	"regexp"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Filter selects events for List, Count and CancelMatching. Every field set
// narrows the selection; the zero Filter selects every event.
type Filter struct {
	// IDPrefix: events whose id starts with it. The narrow filter: a prefix
	// that matches few events is answered from the id index.
	IDPrefix string
	// Topic: events of this topic.
	Topic string
	// States: events in one of these states; every state when empty.
	// CancelMatching takes none or StateScheduled alone.
	States []State
	// DueAfter: events due at or after it; DueBefore: due before it (after
	// DueAfter).
	DueAfter  time.Time
	DueBefore time.Time
	// Priorities: events of one of these priorities (0 to 9); every
	// priority when empty. An event scheduled without Priority has 5, so
	// 5 selects it. Every node must run a release that knows the filter:
	// an earlier one ignores it and answers for every priority (cancels
	// every priority, for CancelMatching).
	Priorities []int
	// StaleOK lets List and Count be answered by any replica from what it
	// has applied, sparing the shard leaders; the answer may miss the
	// latest changes. Off, reads are linearizable.
	StaleOK bool
}

func (f Filter) proto() (*chimev1.EventFilter, error) {
	pf := &chimev1.EventFilter{IdPrefix: f.IDPrefix, Topic: f.Topic}
	for _, s := range f.States {
		pf.States = append(pf.States, chimev1.EventState(s))
	}
	for i, p := range f.Priorities {
		// The server refuses a priority above 9 too; a negative one would
		// reach it as a large uint32, so it is refused here by its value.
		if p < 0 || p > 9 {
			return nil, invalidf("filter.priorities["+strconv.Itoa(i)+"]", "%d, must be 0 (lowest) to 9 (highest)", p)
		}
		pf.Priorities = append(pf.Priorities, uint32(p))
	}
	if !f.DueAfter.IsZero() {
		pf.DueAfter = timestamppb.New(f.DueAfter)
	}
	if !f.DueBefore.IsZero() {
		pf.DueBefore = timestamppb.New(f.DueBefore)
	}
	return pf, nil
}

// listPage is how many events List asks for at a time (the server's most).
const listPage = 1000

// List returns the events f selects, pending and settled, ordered by due
// time, then id, across every shard. It fetches them a page at a time as
// the loop asks for more; each page is retried as any call is, and a page
// continues where the previous ended on any node. Events added or changed
// while it runs appear where they now fall in the order.
//
// An error ends the sequence: it is the last pair yielded.
//
//	for ev, err := range c.List(ctx, client.Filter{Topic: "reminders"}) {
//		if err != nil {
//			return err
//		}
//		...
//	}
func (c *Client) List(ctx context.Context, f Filter) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		pf, err := f.proto()
		if err != nil {
			yield(Event{}, err)
			return
		}
		req := &chimev1.ListRequest{Filter: pf, Limit: listPage, StaleOk: f.StaleOK}
		for {
			var resp *chimev1.ListResponse
			_, tried, err := c.call(ctx, "", false, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
				resp, err = chimev1.NewSchedulerClient(cc).List(ctx, req)
				return err
			})
			if err != nil {
				yield(Event{}, finish("list", "", err, tried))
				return
			}
			for _, g := range resp.Events {
				if !yield(eventFrom(g), nil) {
					return
				}
			}
			if resp.NextPageToken == "" {
				return
			}
			req.PageToken = resp.NextPageToken
		}
	}
}

// Page is one page of ListPage: its events, in List's order, and the token
// that continues after them ("" after the last page).
type Page struct {
	Events []Event
	Next   string
}

// ListPage returns one page of up to size events f selects (1 to 1000),
// starting where token, a Page's Next, left off ("" starts at the
// beginning): for a user interface that shows a page at a time and keeps
// the token in its link. A token holds its place across changes and
// nodes, as List's pages do; it is only valid with the same filter.
func (c *Client) ListPage(ctx context.Context, f Filter, size int, token string) (Page, error) {
	if size < 1 || size > listPage {
		return Page{}, invalidf("limit", "must be 1 to %d (got %d)", listPage, size)
	}
	pf, err := f.proto()
	if err != nil {
		return Page{}, err
	}
	req := &chimev1.ListRequest{Filter: pf, Limit: uint32(size), StaleOk: f.StaleOK, PageToken: token}
	var resp *chimev1.ListResponse
	_, tried, err := c.call(ctx, "", false, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = chimev1.NewSchedulerClient(cc).List(ctx, req)
		return err
	})
	if err != nil {
		return Page{}, finish("list", "", err, tried)
	}
	p := Page{Events: make([]Event, 0, len(resp.Events)), Next: resp.NextPageToken}
	for _, g := range resp.Events {
		p.Events = append(p.Events, eventFrom(g))
	}
	return p, nil
}

// Count returns how many events f selects, as List would list them.
func (c *Client) Count(ctx context.Context, f Filter) (int64, error) {
	pf, err := f.proto()
	if err != nil {
		return 0, err
	}
	var resp *chimev1.CountResponse
	_, tried, err := c.call(ctx, "", false, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = chimev1.NewSchedulerClient(cc).Count(ctx, &chimev1.CountRequest{Filter: pf, StaleOk: f.StaleOK})
		return err
	})
	if err != nil {
		return 0, finish("count", "", err, tried)
	}
	return int64(resp.Count), nil
}

// CancelMatchingOption is DryRun or OnProgress.
type CancelMatchingOption func(*cancelMatchingOptions)

type cancelMatchingOptions struct {
	dryRun   bool
	progress func(CancelMatchingResult)
}

// DryRun makes CancelMatching count the events it would cancel, and cancel
// none.
func DryRun(on bool) CancelMatchingOption {
	return func(o *cancelMatchingOptions) { o.dryRun = on }
}

// OnProgress calls fn with the running totals as the server reports them
// (about every second), from the goroutine that called CancelMatching; the
// last call has Done set.
func OnProgress(fn func(CancelMatchingResult)) CancelMatchingOption {
	return func(o *cancelMatchingOptions) { o.progress = fn }
}

// CancelMatchingResult counts what CancelMatching did (so far, to OnProgress).
type CancelMatchingResult struct {
	// Matched pending events; every one is counted once more in Cancelled
	// or Skipped (only here, in a dry run).
	Matched, Cancelled, Skipped int64
	// Done is set on the totals of a run that finished.
	Done bool
	// Held counts the skipped events that a record of may already be on its
	// way to Kafka; run CancelMatching again to cancel those still pending
	// then.
	Held int64
}

// CancelMatching cancels every pending event f selects (f must name an id
// prefix, a topic or a due range, which its Priorities only narrow, and its
// States none or StateScheduled alone), in batches through
// Raft: every event it counts as cancelled will not be produced. Events
// that fired first, or that a record of may already be on its way to
// Kafka, are skipped and counted.
//
// A run cut short (a node going away, a leader change) is run again, which
// finds what is still pending, within the RetryPolicy; the totals then add
// up the runs (a cut-short run counted as of its last report). On an
// error the totals so far are returned with it.
func (c *Client) CancelMatching(ctx context.Context, f Filter, opts ...CancelMatchingOption) (CancelMatchingResult, error) {
	var o cancelMatchingOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if c.closed.Load() {
		return CancelMatchingResult{}, finish("cancel-matching", "", errClosed, nil)
	}
	pf, err := f.proto()
	if err != nil {
		return CancelMatchingResult{}, err
	}
	req := &chimev1.CancelMatchingRequest{Filter: pf, DryRun: o.dryRun}
	var base CancelMatchingResult // what the runs cut short before this one settled
	a := newAttempts(ctx, c.retry, false)
	for {
		a.n++
		run, progressed, err := c.cancelMatchingRun(ctx, req, func(run CancelMatchingResult) {
			if o.progress != nil {
				o.progress(base.plus(run))
			}
		})
		if err == nil {
			return base.plus(run), nil
		}
		// What the cut-short run settled for good is counted; what it held,
		// or matched without reaching, the next run finds again.
		cancelled := max(run.Cancelled, cancelledBefore(err))
		fired := run.Skipped - run.Held
		base.Matched += cancelled + fired
		base.Cancelled += cancelled
		base.Skipped += fired
		if progressed {
			// A fresh budget after progress: a long run cut short late
			// still gets its retries.
			a = newAttempts(ctx, c.retry, false)
			a.n = 1
		}
		if !a.retry(err) {
			return base, finish("cancel-matching", "", err, c.addrs)
		}
	}
}

func (r CancelMatchingResult) plus(run CancelMatchingResult) CancelMatchingResult {
	return CancelMatchingResult{
		Matched:   r.Matched + run.Matched,
		Cancelled: r.Cancelled + run.Cancelled,
		Skipped:   r.Skipped + run.Skipped,
		Held:      r.Held + run.Held,
		Done:      run.Done,
	}
}

// cancelMatchingRun runs one CancelMatching stream and returns its totals,
// and whether the server reported any.
func (c *Client) cancelMatchingRun(ctx context.Context, req *chimev1.CancelMatchingRequest, progress func(CancelMatchingResult)) (CancelMatchingResult, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream on every return
	var run CancelMatchingResult
	stream, err := chimev1.NewSchedulerClient(c.conn).CancelMatching(ctx, req)
	if err != nil {
		return run, false, err
	}
	for progressed := false; ; progressed = true {
		p, err := stream.Recv()
		if err == io.EOF {
			err = status.Error(codes.Unavailable, "the stream ended without its totals")
		}
		if err != nil {
			return run, progressed, err
		}
		run = CancelMatchingResult{
			Matched:   int64(p.Matched),
			Cancelled: int64(p.Cancelled),
			Skipped:   int64(p.SkippedFired + p.SkippedHeld),
			Held:      int64(p.SkippedHeld),
			Done:      p.Done,
		}
		progress(run)
		if p.Done {
			return run, true, nil
		}
	}
}

// "... (12 matched and 10 cancelled before it stopped: run it again to finish)"
var cancelledBeforeRe = regexp.MustCompile(`(\d+) matched and (\d+) cancelled before it stopped`)

func cancelledBefore(err error) int64 {
	st, ok := status.FromError(err)
	if !ok {
		return 0
	}
	m := cancelledBeforeRe.FindStringSubmatch(st.Message())
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[2], 10, 64)
	return n
}
