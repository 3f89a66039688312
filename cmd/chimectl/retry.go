package main

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// dial connects to addr (lazily: a dead address shows up as UNAVAILABLE on
// the first call), in TLS if the --tls flags ask for it, with
// retryUnavailable on every unary call.
func (c *cli) dial(addr string) (*grpc.ClientConn, error) {
	opts, err := c.tls.dialOptions(addr)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithUnaryInterceptor(retryUnavailable))...)
	if err != nil {
		return nil, fmt.Errorf("--addr %q: %w", addr, err)
	}
	return conn, nil
}

// repeatable are the calls whose repetition changes nothing, so that one
// answered UNAVAILABLE (a node restarting, a shard between leaders) may be
// sent again. Schedule is repeatable because chimectl always sends an id
// (it picks one when --id is not given): a second copy of a request that
// did arrive returns the original result. Cancelling a cancelled event
// succeeds again. TransferLeader and RemoveNode are not repeated; Drain is
// left to drain --wait, which polls it and reports each UNAVAILABLE between
// polls.
var repeatable = map[string]bool{
	chimev1.Scheduler_Schedule_FullMethodName:  true,
	chimev1.Scheduler_Cancel_FullMethodName:    true,
	chimev1.Scheduler_Get_FullMethodName:       true,
	chimev1.Admin_GetClusterMap_FullMethodName: true,
	chimev1.Admin_Status_FullMethodName:        true,
	chimev1.Admin_NodeStatus_FullMethodName:    true,
}

// Backoff between attempts: from 100 ms, growing 1.5x with ±50% jitter, at
// most 2 s apart, so a leader election (about a second) costs a few tries.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 2 * time.Second
	// retryNoDeadline bounds the retries of a call without a deadline
	// (--timeout 0), where the call itself may still wait forever.
	retryNoDeadline = 10 * time.Second
)

// retryUnavailable repeats a repeatable call that failed with UNAVAILABLE,
// with exponential backoff, until it gets another answer or until the next
// attempt could not start before ctx's deadline (--timeout); it then
// returns the last answer, so the error says why, not just that time ran
// out.
func retryUnavailable(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !repeatable[method] {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = retryFirst, retryMax
	limit := retryNoDeadline
	if dl, ok := ctx.Deadline(); ok {
		limit = time.Until(dl)
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err != nil && status.Code(err) != codes.Unavailable {
			err = backoff.Permanent(err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(limit))
	return err
}
