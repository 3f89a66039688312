package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/chimehq/chime/client"
)

// countBudget is how long the events page waits for its count after the
// first page of the list is ready, counted from when both calls started
// (they run side by side). A count reads every match, and by a prefix that
// matches 10M events it takes about 0.7 s, while the list answers in tens
// of milliseconds: the page is shown without a count that is not done in
// time, and a script fills it in from /ui/events/count. 150 ms keeps a
// first page within 300 ms of server time with room for the list and the
// rendering, and a narrow filter's count is done well within it.
const countBudget = 150 * time.Millisecond

// countWait is how long the events page waits for its count, in
// nanoseconds: countBudget, or below zero not at all, not even for a
// count already done (the count is then always left to the script; a
// test sets that with export_test.go, as the count of a small test
// cluster is always in time).
var countWait atomic.Int64

func init() { countWait.Store(int64(countBudget)) }

// counted is a Count's answer and how long it took.
type counted struct {
	n    int64
	err  error
	took time.Duration
}

// startCount counts what f selects in a goroutine owned by the caller, who
// must call stop once done with it (when its handler returns): stop cancels
// the count if it is still running. The answer arrives on the channel,
// which holds it, so the goroutine never waits for a reader.
func startCount(ctx context.Context, cl *client.Client, f client.Filter) (answer <-chan counted, stop context.CancelFunc) {
	ctx, stop = context.WithCancel(ctx)
	ch := make(chan counted, 1)
	go func() {
		start := time.Now()
		n, err := cl.Count(ctx, f)
		ch <- counted{n: n, err: err, took: time.Since(start)}
	}()
	return ch, stop
}

// awaitCount waits for the count started at start until its budget is
// spent, and reports whether it came. A count already done is taken
// whatever the budget.
func awaitCount(answer <-chan counted, start time.Time) (counted, bool) {
	budget := time.Duration(countWait.Load())
	if budget < 0 {
		return counted{}, false
	}
	select {
	case res := <-answer:
		return res, true
	default:
	}
	wait := budget - time.Since(start)
	if wait <= 0 {
		return counted{}, false
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case res := <-answer:
		return res, true
	case <-timer.C:
		return counted{}, false
	}
}

// countJSON is what /ui/events/count answers: the count, or why not.
type countJSON struct {
	Count *int64 `json:"count,omitempty"`
	Error string `json:"error,omitempty"`
}

// countEndpoint answers the count of the events the query string's filter
// selects (the events page's filter) as JSON: the events page's script
// fills in the count it did not wait for. It is a read, for a signed-in
// session, made as the session's credential as the page's calls are.
func (c *Console) countEndpoint(w http.ResponseWriter, r *http.Request, s *session) {
	_, f, err := readFilter(r.URL.Query(), c.cfg.Now())
	if err != nil {
		c.failJSON(w, err)
		return
	}
	cl, ctx, cancel, ok := c.jsonCallsFor(w, r, s)
	if !ok {
		return
	}
	defer cancel()
	start := time.Now()
	n, err := cl.Count(ctx, f)
	if err != nil {
		c.failJSON(w, err)
		return
	}
	var st serverTiming
	st.add("count", time.Since(start))
	st.set(w)
	writeJSON(w, http.StatusOK, countJSON{Count: &n})
}

// signedInJSON is signedIn for an endpoint a script reads: a request
// without a session is answered 401 with a JSON error, where a page is
// redirected to the sign-in.
func (c *Console) signedInJSON(h handler) http.HandlerFunc {
	inner := c.signedIn(h)
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.Auth != nil && c.sessionOf(r) == nil {
			writeJSON(w, http.StatusUnauthorized, countJSON{Error: "not signed in, or the session expired: sign in again at /ui/login"})
			return
		}
		inner(w, r)
	}
}

// failJSON answers err as JSON with the status code fail would show it
// with.
func (c *Console) failJSON(w http.ResponseWriter, err error) {
	writeJSON(w, errorCode(err), countJSON{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client may have gone; no one to tell
}

// errorCode is the HTTP status an error of a call to the cluster is shown
// with.
func errorCode(err error) int {
	var inv *client.InvalidError
	switch {
	case errors.As(err, &inv), errors.Is(err, errBadInput):
		return http.StatusBadRequest
	case errors.Is(err, client.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, client.ErrPermissionDenied), errors.Is(err, client.ErrUnauthenticated):
		return http.StatusForbidden
	case errors.Is(err, client.ErrConflict), errors.Is(err, client.ErrAlreadyFired), errors.Is(err, client.ErrCancelled):
		return http.StatusConflict
	}
	return http.StatusBadGateway
}

// serverTiming is a Server-Timing response header (W3C Server Timing):
// how long each step of a page took on the server, in milliseconds, which
// browsers' developer tools show and curl -D- prints, so that a page's
// server time can be measured without its network and rendering.
type serverTiming []string

// add records step name as taking d.
func (t *serverTiming) add(name string, d time.Duration) {
	*t = append(*t, fmt.Sprintf("%s;dur=%.1f", name, float64(d)/float64(time.Millisecond)))
}

// note records step name, with no duration, described by desc.
func (t *serverTiming) note(name, desc string) {
	*t = append(*t, fmt.Sprintf("%s;desc=%q", name, desc))
}

func (t serverTiming) set(w http.ResponseWriter) {
	w.Header().Set("Server-Timing", strings.Join(t, ", "))
}
