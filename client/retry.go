package client

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RetryPolicy bounds the retries of one call. A zero field takes its
// default, so WithRetry(RetryPolicy{MaxAttempts: 3}) changes only that.
//
// A call is repeated when its attempt failed with UNAVAILABLE (no node, or
// a shard between leaders), ABORTED (Chime's "nothing changed, retry": an
// event being fired while it is cancelled or updated), DEADLINE_EXCEEDED of
// the attempt alone (AttemptTimeout, not the caller's context), or
// RESOURCE_EXHAUSTED carrying a RetryInfo (a rate or pending limit that
// frees up; the wait is at least the delay the server names and at least
// ExhaustedBackoff). Nothing else is repeated: INVALID_ARGUMENT,
// ALREADY_EXISTS, FAILED_PRECONDITION, PERMISSION_DENIED, UNAUTHENTICATED,
// NOT_FOUND and a RESOURCE_EXHAUSTED without RetryInfo (a quota, a batch
// over the credential's burst) are answers, returned at once.
//
// The waits between attempts grow exponentially, with ±50% jitter. Retries
// stop at the first of: MaxAttempts, Budget, or the point where the next
// attempt could not start before the context's deadline.
type RetryPolicy struct {
	// InitialBackoff is the wait after the first failed attempt (default
	// 50ms); each further wait is 1.5 times longer, up to MaxBackoff
	// (default 2s).
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// MaxAttempts counts the first attempt too (default 8); 1 turns retries
	// off.
	MaxAttempts int
	// AttemptTimeout bounds each attempt (default 10s), under the context's
	// own deadline, so that one attempt stuck on a dying node is abandoned
	// and repeated while the call still has time.
	AttemptTimeout time.Duration
	// ExhaustedBackoff is the least wait after RESOURCE_EXHAUSTED (default
	// 1s).
	ExhaustedBackoff time.Duration
	// Budget bounds the time one call spends over all its attempts and
	// waits (default 30s), also when the context allows longer or has no
	// deadline.
	Budget time.Duration
}

// defaultRetry is the policy a Client uses without WithRetry.
var defaultRetry = RetryPolicy{
	InitialBackoff:   50 * time.Millisecond,
	MaxBackoff:       2 * time.Second,
	MaxAttempts:      8,
	AttemptTimeout:   10 * time.Second,
	ExhaustedBackoff: time.Second,
	Budget:           30 * time.Second,
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	d := defaultRetry
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = d.InitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = max(d.MaxBackoff, p.InitialBackoff)
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = d.MaxAttempts
	}
	if p.AttemptTimeout <= 0 {
		p.AttemptTimeout = d.AttemptTimeout
	}
	if p.ExhaustedBackoff <= 0 {
		p.ExhaustedBackoff = d.ExhaustedBackoff
	}
	if p.Budget <= 0 {
		p.Budget = d.Budget
	}
	return p
}

// errClosed is the error of a call made after Close.
var errClosed = status.Error(codes.Canceled, "the client is closed")

// resolveReserve is the share of a call's remaining time that a change
// whose outcome may turn out unknown keeps back from its attempts, to read
// the outcome with Get; at most maxResolveReserve.
const (
	resolveReserve    = 5 // 1/5
	maxResolveReserve = time.Second
)

// minAttempt is the least time a retry must have before the call's end:
// one with less would be cut off by the deadline, and the call would end
// with DEADLINE_EXCEEDED rather than the last real answer.
const minAttempt = 25 * time.Millisecond

// attempts paces the attempts of one call.
type attempts struct {
	p      RetryPolicy
	ctx    context.Context
	stopAt time.Time // attempts end here (the deadline, less the reserve)
	n      int       // attempts made
	b      *backoff.ExponentialBackOff
	// ambiguous is set once an attempt failed in a way that leaves it
	// unknown whether the server applied it.
	ambiguous bool
}

// newAttempts starts the attempts of a call under ctx. reserve keeps time
// back for reading an unknown outcome afterwards.
func newAttempts(ctx context.Context, p RetryPolicy, reserve bool) *attempts {
	now := time.Now()
	stop := now.Add(p.Budget)
	if dl, ok := ctx.Deadline(); ok && dl.Before(stop) {
		stop = dl
	}
	if reserve {
		stop = stop.Add(-min(stop.Sub(now)/resolveReserve, maxResolveReserve))
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = p.InitialBackoff, p.MaxBackoff
	return &attempts{p: p, ctx: ctx, stopAt: stop, b: b}
}

// attempt returns the context of the next attempt.
func (a *attempts) attempt() (context.Context, context.CancelFunc) {
	a.n++
	return context.WithDeadline(a.ctx, a.deadline())
}

// deadline is the next attempt's deadline: AttemptTimeout from now, but not
// past stopAt (so at least a moment: the first attempt always runs, and
// the caller's context bounds it anyway).
func (a *attempts) deadline() time.Time {
	d := time.Now().Add(a.p.AttemptTimeout)
	if a.stopAt.Before(d) {
		d = a.stopAt
	}
	return d
}

// retry reports whether the call should be attempted again after err,
// having waited out the backoff; false means err is the answer.
func (a *attempts) retry(err error) bool {
	if mayHaveApplied(err) {
		a.ambiguous = true
	}
	wait, ok := retryable(err, a.ctx)
	if !ok || a.n >= a.p.MaxAttempts {
		return false
	}
	next := a.b.NextBackOff()
	if wait > 0 { // RESOURCE_EXHAUSTED: the server's delay, jittered up
		next = max(wait, a.p.ExhaustedBackoff) + next
	}
	if time.Now().Add(next + minAttempt).After(a.stopAt) {
		return false // the call would end cut short, not answered
	}
	t := time.NewTimer(next)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-a.ctx.Done():
		return false
	}
}

// retryable reports whether an attempt that failed with err may be sent
// again, and the least wait the server asked for (RESOURCE_EXHAUSTED).
func retryable(err error, ctx context.Context) (time.Duration, bool) {
	if ctx.Err() != nil {
		return 0, false
	}
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	switch st.Code() {
	case codes.Unavailable, codes.Aborted:
		return 0, true
	case codes.DeadlineExceeded:
		// The attempt's own deadline (the caller's is checked above).
		return 0, true
	case codes.ResourceExhausted:
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				return max(ri.GetRetryDelay().AsDuration(), time.Millisecond), true
			}
		}
	}
	return 0, false
}

// mayHaveApplied reports whether an attempt that failed with err may
// nevertheless have taken effect on the server.
func mayHaveApplied(err error) bool {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.Unknown, codes.DeadlineExceeded, codes.Canceled, codes.Internal:
		return true
	case codes.Unavailable:
		// Not when gRPC could not connect at all: then nothing was sent.
		return !strings.Contains(st.Message(), "while dialing")
	}
	return false
}

// conn is where one attempt goes: the cluster (main) or a shard leader.
type conn struct {
	grpc.ClientConnInterface
	leader string // the leader's address; empty for the main connection
}

// call runs f with retries, routing each attempt by id ("" for a call
// that any node answers as well as another: those go to the main
// connection). reserve keeps time back to resolve an unknown outcome. It
// returns whether some attempt may have taken effect unseen, the nodes
// tried, and f's last error unmapped.
func (c *Client) call(ctx context.Context, id string, reserve bool, f func(ctx context.Context, cc grpc.ClientConnInterface) error) (ambiguous bool, tried []string, err error) {
	if c.closed.Load() {
		return false, nil, errClosed
	}
	a := newAttempts(ctx, c.retry, reserve)
	for {
		cc := c.router.pick(id)
		tried = addTried(tried, c, cc)
		actx, cancel := a.attempt()
		err = f(actx, cc)
		cancel()
		if err == nil {
			return a.ambiguous, tried, nil
		}
		if cc.leader != "" && leaderTrouble(ctx, err) {
			c.router.leaderFailed(cc.leader)
		}
		if !a.retry(err) {
			return a.ambiguous, tried, err
		}
	}
}

// leaderTrouble reports whether err, from a shard's leader as the cluster
// map has it, suggests the map is out of date: the node is gone or not the
// leader any more (UNAVAILABLE), or did not answer in time.
func leaderTrouble(ctx context.Context, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.DeadlineExceeded:
		return ctx.Err() == nil
	}
	return false
}

func addTried(tried []string, c *Client, cc conn) []string {
	add := func(a string) {
		for _, t := range tried {
			if t == a {
				return
			}
		}
		tried = append(tried, a)
	}
	if cc.leader != "" {
		add(cc.leader)
		return tried
	}
	for _, a := range c.addrs {
		add(a)
	}
	return tried
}

// finish maps the error of a call that no resolution applies to.
func finish(op, id string, err error, tried []string) error {
	err = mapError(op, id, err)
	if e := (*Error)(nil); errors.As(err, &e) && e.Code() == codes.Unavailable {
		e.Tried = tried
	}
	return err
}
