package client

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The kinds of error a call returns, for errors.Is. Every error the client
// returns for an answer of the server also keeps the gRPC status:
// status.Code(err) and status.FromError(err) see it.
var (
	// ErrNotFound: no event (or recurring schedule) has the id. A settled
	// event is removed once the cluster's retention has passed.
	ErrNotFound = errors.New("chime: not found")
	// ErrConflict: the id is taken by other content (Schedule, Recurring
	// Create), or the event or schedule is not at the version IfVersion
	// named. errors.As with a *ConflictError gives the stored version.
	ErrConflict = errors.New("chime: conflict")
	// ErrAlreadyFired: the event has fired or been dead-lettered, so it can
	// no longer be cancelled or updated.
	ErrAlreadyFired = errors.New("chime: already fired")
	// ErrCancelled: the event has been cancelled, so it can no longer be
	// updated. (Cancelling it again succeeds.)
	ErrCancelled = errors.New("chime: cancelled")
	// ErrNotPaused: Resume of a recurring schedule that is not paused.
	ErrNotPaused = errors.New("chime: not paused")
	// ErrCompleted: Trigger or Backfill of a recurring schedule that has
	// completed (its rule has no further occurrence).
	ErrCompleted = errors.New("chime: schedule completed")
	// ErrPermissionDenied: the credential may not do this (to this id or
	// topic).
	ErrPermissionDenied = errors.New("chime: permission denied")
	// ErrUnauthenticated: the server did not accept the credential (no
	// token, or a wrong one).
	ErrUnauthenticated = errors.New("chime: unauthenticated")
	// ErrInvalid: the server (or the client, before sending) refused the
	// input. errors.As with an *InvalidError gives the field and the rule.
	ErrInvalid = errors.New("chime: invalid argument")
	// ErrUnavailable: no node answered, or none could serve the call, until
	// the retries or the context ran out.
	ErrUnavailable = errors.New("chime: unavailable")
	// ErrUnknownOutcome: the last attempt of a change went unanswered and the
	// client could not read back whether it took effect. Sending the same
	// request again (with the same id) is safe.
	ErrUnknownOutcome = errors.New("chime: outcome unknown")
)

// Error is a failed call whose answer has no more specific type: it names
// the operation and the id, and keeps the server's status. errors.Is matches
// it against the Err* kinds above, and against context.DeadlineExceeded and
// context.Canceled for those codes.
type Error struct {
	Op string // the client method: "schedule", "get", "recurring.pause", ...
	ID string // the event or schedule id; empty when the call names none
	// Tried lists the addresses the call was sent to, for UNAVAILABLE.
	Tried []string

	kinds []error
	st    *status.Status
}

// Error says the operation, the id and the server's answer.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("chime: ")
	b.WriteString(e.Op)
	if e.ID != "" {
		fmt.Fprintf(&b, " %q", e.ID)
	}
	b.WriteString(": ")
	if slices.Contains(e.kinds, ErrUnknownOutcome) {
		b.WriteString("outcome unknown: ")
	}
	if len(e.Tried) > 0 && e.st.Code() == codes.Unavailable {
		fmt.Fprintf(&b, "no node answered (tried %s): ", strings.Join(e.Tried, ", "))
	}
	fmt.Fprintf(&b, "%s: %s", codeName(e.st.Code()), e.st.Message())
	return b.String()
}

// Is reports whether e is of kind target.
func (e *Error) Is(target error) bool {
	switch target {
	case context.DeadlineExceeded:
		return e.st.Code() == codes.DeadlineExceeded
	case context.Canceled:
		return e.st.Code() == codes.Canceled
	}
	return slices.Contains(e.kinds, target)
}

// GRPCStatus is the server's answer (or the transport's).
func (e *Error) GRPCStatus() *status.Status { return e.st }

// Code is the gRPC status code of the answer.
func (e *Error) Code() codes.Code { return e.st.Code() }

// Unwrap returns the gRPC status error.
func (e *Error) Unwrap() error { return e.st.Err() }

// ConflictError is ErrConflict with what the client learned: the version the
// event or schedule is at (0 when not known, such as when it could not be
// read back).
type ConflictError struct {
	ID      string
	Version uint64
	st      *status.Status
}

// Error says the id, the stored version and the server's answer.
func (e *ConflictError) Error() string {
	v := ""
	if e.Version != 0 {
		v = fmt.Sprintf(" (stored version %d)", e.Version)
	}
	return fmt.Sprintf("chime: conflict on %q%s: %s", e.ID, v, e.st.Message())
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// GRPCStatus is the server's answer.
func (e *ConflictError) GRPCStatus() *status.Status { return e.st }

// Unwrap returns the gRPC status error.
func (e *ConflictError) Unwrap() error { return e.st.Err() }

// InvalidError is a refused input: the field's path in the request (such as
// "event.topic", "events[3].headers[0].key", "rule.cron") and the rule it
// broke, as the server words them. errors.Is(err, ErrInvalid) is true.
type InvalidError struct {
	Field string
	Rule  string
	st    *status.Status
}

// Error says the field and the rule.
func (e *InvalidError) Error() string {
	if e.Field == "" {
		return "chime: invalid argument: " + e.Rule
	}
	return "chime: invalid argument: " + e.Field + ": " + e.Rule
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// GRPCStatus is the server's answer: INVALID_ARGUMENT, or
// FAILED_PRECONDITION for input the stored event refuses (an Update's
// payload for a tombstone event).
func (e *InvalidError) GRPCStatus() *status.Status { return e.st }

// Unwrap returns the gRPC status error.
func (e *InvalidError) Unwrap() error { return e.st.Err() }

// BatchError is ScheduleBatch's error when some events failed: Errs has one
// entry per event, in order, nil for those that succeeded (the same errors
// as the Results' Err). errors.Is and errors.As look through every entry.
type BatchError struct {
	Errs []error
}

// Error counts the failed events and quotes the first.
func (e *BatchError) Error() string {
	n, first := 0, -1
	for i, err := range e.Errs {
		if err != nil {
			n++
			if first < 0 {
				first = i
			}
		}
	}
	if n == 0 {
		return "chime: batch: no error"
	}
	return fmt.Sprintf("chime: batch: %d of %d events failed; first, events[%d]: %v", n, len(e.Errs), first, e.Errs[first])
}

// Unwrap returns the events' errors, without the nils.
func (e *BatchError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

func invalidf(field, format string, args ...any) *InvalidError {
	rule := fmt.Sprintf(format, args...)
	return &InvalidError{Field: field, Rule: rule, st: status.New(codes.InvalidArgument, field+": "+rule)}
}

// Messages of the server that say more than their code.
var (
	// "expected_version: event "x" is at version 7, not 6" (events and
	// recurring schedules alike).
	atVersion = regexp.MustCompile(`is at version (\d+)`)
	// "... exists with another rule or target (version 3) ..."
	parenVersion = regexp.MustCompile(`\(version (\d+)\)`)
)

// mapError turns a call's error into the client's: nil stays nil, an error
// without a status (the caller's own context) is returned as it is.
func mapError(op, id string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if e := (*Error)(nil); errors.As(err, &e) {
		return err // already mapped
	}
	msg := st.Message()
	switch st.Code() {
	case codes.InvalidArgument:
		field, rule, found := strings.Cut(msg, ": ")
		if !found || strings.ContainsAny(field, " \t") {
			field, rule = "", msg
		}
		return &InvalidError{Field: field, Rule: rule, st: st}
	case codes.AlreadyExists:
		return &ConflictError{ID: id, Version: versionIn(parenVersion, msg), st: st}
	case codes.FailedPrecondition:
		switch {
		case strings.HasPrefix(msg, "expected_version:"):
			return &ConflictError{ID: id, Version: versionIn(atVersion, msg), st: st}
		case strings.Contains(msg, "already fired") || strings.Contains(msg, "dead-lettered"):
			return &Error{Op: op, ID: id, kinds: []error{ErrAlreadyFired}, st: st}
		case strings.Contains(msg, "been cancelled"):
			return &Error{Op: op, ID: id, kinds: []error{ErrCancelled}, st: st}
		case strings.Contains(msg, "not paused"):
			return &Error{Op: op, ID: id, kinds: []error{ErrNotPaused}, st: st}
		case strings.Contains(msg, "is completed"):
			return &Error{Op: op, ID: id, kinds: []error{ErrCompleted}, st: st}
		case strings.HasPrefix(msg, "to: "):
			// A Backfill's range that reaches past the pending occurrence:
			// input the stored schedule refuses.
			return &InvalidError{Field: "to", Rule: strings.TrimPrefix(msg, "to: "), st: st}
		case strings.HasPrefix(msg, "payload: "):
			// An Update's payload for a tombstone event: input the stored
			// event refuses.
			return &InvalidError{Field: "payload", Rule: strings.TrimPrefix(msg, "payload: "), st: st}
		}
	case codes.NotFound:
		return &Error{Op: op, ID: id, kinds: []error{ErrNotFound}, st: st}
	case codes.PermissionDenied:
		return &Error{Op: op, ID: id, kinds: []error{ErrPermissionDenied}, st: st}
	case codes.Unauthenticated:
		return &Error{Op: op, ID: id, kinds: []error{ErrUnauthenticated}, st: st}
	case codes.Unavailable:
		return &Error{Op: op, ID: id, kinds: []error{ErrUnavailable}, st: st}
	}
	return &Error{Op: op, ID: id, st: st}
}

// unknownOutcome marks err (mapped) as ErrUnknownOutcome.
func unknownOutcome(op, id string, err error) error {
	e := (*Error)(nil)
	if !errors.As(err, &e) {
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	cp := *e
	cp.kinds = append([]error{ErrUnknownOutcome}, e.kinds...)
	return &cp
}

func versionIn(re *regexp.Regexp, msg string) uint64 {
	m := re.FindStringSubmatch(msg)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseUint(m[1], 10, 64)
	return v
}

// codeName is a code as the proto names it: "UNAVAILABLE".
func codeName(c codes.Code) string {
	var b strings.Builder
	prevLower := false
	for _, r := range c.String() {
		upper := r >= 'A' && r <= 'Z'
		if upper && prevLower {
			b.WriteByte('_')
		}
		prevLower = !upper
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}
