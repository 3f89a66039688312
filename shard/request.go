package shard

import (
	"errors"
	"fmt"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
)

// Request is one event to schedule, as the client sent it and the rpc layer
// validated it. The shard leader resolves Delay into a due time with its own
// clock when it proposes the event.
type Request struct {
	ID           string
	DeliverAt    int64 // Unix ns; meaningful when HasDeliverAt
	Delay        time.Duration
	HasDeliverAt bool
	HasDelay     bool
	Topic        string
	Key          []byte
	Payload      []byte
	Headers      []raftfsm.Header
	// ContentHash is raftfsm.ContentHash over the fields above as sent, so a
	// re-send with the same relative delay is recognised as identical.
	ContentHash uint64
	// Replace makes the event take the place of the one its id is bound to
	// (raftfsm.NewEvent.Replace) instead of being compared with it.
	Replace bool
	// Policy is the event's priority and window (raftfsm.DefaultPolicy
	// when the client set neither).
	Policy raftfsm.Policy
	// Output is the event's partition and tombstone (the zero value when
	// the client set neither).
	Output raftfsm.Output
	// Scope is what the caller's credential may act on (nil: anything).
	// The event the id is bound to must be in it for a Replace, and for a
	// create that collides with it to be told ALREADY_EXISTS.
	Scope Scope

	// pending is the seq of the pending event a Replace supersedes, as the
	// leader pinned it (0: none was pending); see Shard.pinReplaced.
	pending uint64
}

// Change is one Update as the client sent it and the rpc layer validated
// it. With raftfsm.ChangeDue in Fields and HasDelay set, the leader resolves
// the due time as its clock at the proposal plus Delay; otherwise Due is
// the absolute due time.
type Change struct {
	raftfsm.Change
	Delay    time.Duration
	HasDelay bool
	// Scope is what the caller's credential may act on (nil: anything);
	// the event as stored must be in it.
	Scope Scope
}

// Scope is what one credential may see and change. The shard leader checks
// it against the event as stored, in the read it does for the operation
// anyway, so that a credential can never act on another's event by naming
// its id, whatever the request itself says.
type Scope interface {
	// Permits reports whether the credential may act on the event or
	// schedule id whose topic is topic.
	Permits(id, topic string) bool
	// Credential names the credential in refusals.
	Credential() string
}

// NotPermittedError refuses an operation on an id outside the caller's
// Scope. It reads the same whether or not the id exists, and names neither
// the stored event's topic nor anything else about it.
type NotPermittedError struct {
	ID, Credential string
}

func (e *NotPermittedError) Error() string {
	return fmt.Sprintf("id %q: not permitted for credential %q", e.ID, e.Credential)
}

// Refuse is the NotPermittedError of scope for id.
func Refuse(scope Scope, id string) error {
	return &NotPermittedError{ID: id, Credential: scope.Credential()}
}

// permits reports whether scope (nil: anything) may act on rec.
func permits(scope Scope, rec *raftfsm.Record) bool {
	return scope == nil || scope.Permits(rec.ID, rec.Topic)
}

// Result is what scheduling one Request did.
type Result struct {
	Outcome raftfsm.ScheduleOutcome // Created, Existing, Conflict, Replaced or Renewed
	Seq     uint64
	Due     int64  // Unix ns; the original due time when Existing
	Version uint64 // the version it made; 0 when Existing or Conflict
	// Err, when set, says why this request was refused, changing nothing
	// (a Replace of an event being fired: ErrFiring, ErrProduceUnknown,
	// ErrChanging); Outcome is then zero.
	Err error
}

// Errors returned by shards and the host. The rpc layer maps each to a gRPC
// status code in one place.
var (
	// ErrNotLeader: this node does not lead the shard; the request was not
	// proposed. Retry on the leader.
	ErrNotLeader = errors.New("shard: not the leader")
	// ErrStopped: the shard or host is shutting down.
	ErrStopped = errors.New("shard: stopped")
	// ErrUnknownShard: this node holds no replica of the shard.
	ErrUnknownShard = errors.New("shard: no replica of this shard on this node")
	// ErrProduceUnknown: a record of the event may still reach Kafka (a
	// produce attempt went unanswered, or the shard changed leader around
	// the event's due time), so a cancel now could not promise that no
	// record follows. Nothing was changed; retry once the event has fired.
	ErrProduceUnknown = errors.New("shard: a record of this event may already be on its way to Kafka (an unanswered produce attempt, or a leader change around its due time)")
	// ErrCancelUnsure: the event is cancelled and will not be fired again,
	// but a record from an earlier produce attempt may still reach Kafka.
	ErrCancelUnsure = errors.New("shard: cancelled, but a record from an earlier produce attempt may still reach Kafka")
	// ErrFiring: a fire batch holds the event (it is due, or about to be,
	// and being produced), so a change now could not promise that the
	// version it replaces is not produced. Nothing was changed.
	ErrFiring = errors.New("shard: the event is being fired")
	// ErrChanging: another change of the event is under way on this
	// leader. Nothing was changed.
	ErrChanging = errors.New("shard: another change of this event is under way")
	// ErrTombstonePayload: an Update would give a payload to a tombstone
	// event (raftfsm.Output.Tombstone), whose record has a null value.
	// Nothing was changed.
	ErrTombstonePayload = errors.New("shard: the event is a tombstone (its record has a null value), so its payload must stay empty")
	// ErrChangeUnknown: leadership was lost after a change was proposed, so
	// it may or may not commit. Unlike ErrNotLeader, which means nothing was
	// proposed, it is not retried by itself: a change is not idempotent.
	ErrChangeUnknown = errors.New("shard: leadership was lost while the change was proposed; it may or may not take effect (Get shows the event's version)")
)

// For maps an event id to its shard: chimev1.ShardOf, the mapping the API
// documents (FNV-1a over the id, modulo the shard count). The count is fixed
// when the cluster is created, so the mapping never changes for a cluster.
func For(id string, shards int) uint32 { return chimev1.ShardOf(id, uint32(shards)) }
