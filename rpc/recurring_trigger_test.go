package rpc_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/auth"
)

// hourly is a schedule every hour from ten hours before t0: ten past instants to backfill.
func hourly(id string) *chimev1.CreateRecurringRequest {
	return &chimev1.CreateRecurringRequest{
		Id:     id,
		Rule:   &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Hour)}, Start: timestamppb.New(t0.Add(-10 * time.Hour))},
		Target: &chimev1.RecurringTarget{Topic: "reports", Payload: []byte("run")},
	}
}

// TestRecurringTriggerAndBackfill: a Trigger makes the occurrence <id>@<at ms> with the
// schedule's target, due at at, and a retry with the same at finds it; a Backfill makes the
// rule's instants in [from, to), due now, and a retry finds them all. Neither moves the
// schedule's own pending occurrence.
func TestRecurringTriggerAndBackfill(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	rc := chimev1.NewRecurringClient(e.conn)
	sc := chimev1.NewSchedulerClient(e.conn)
	created, err := rc.Create(ctx(t), hourly("h"))
	if err != nil {
		t.Fatal(err)
	}

	at := t0.Add(-1500 * time.Microsecond) // kept to the millisecond
	trig := &chimev1.TriggerRecurringRequest{Id: "h", At: timestamppb.New(at)}
	got, err := rc.Trigger(ctx(t), trig)
	wantID := fmt.Sprintf("h@%d", at.UnixMilli())
	if err != nil || got.EventId != wantID || got.Existing || !got.Occurrence.AsTime().Equal(time.UnixMilli(at.UnixMilli())) || !got.Due.AsTime().Equal(t0) {
		t.Fatalf("Trigger: %v, %v; want %s due at t0", got, err, wantID)
	}
	ev, err := sc.Get(ctx(t), &chimev1.GetRequest{Id: wantID})
	if err != nil || ev.Event.Topic != "reports" || string(ev.Event.Payload) != "run" {
		t.Fatalf("the triggered event: %v, %v", ev, err)
	}
	var hs []string
	for _, h := range ev.Event.Headers {
		hs = append(hs, h.Key+"="+string(h.Value))
	}
	if want := fmt.Sprintf("%s=h %s=%d", raftfsm.HeaderRecurringID, raftfsm.HeaderOccurrenceUnix, at.UnixMilli()); strings.Join(hs, " ") != want {
		t.Fatalf("the triggered event's headers: %v, want %s", hs, want)
	}
	again, err := rc.Trigger(ctx(t), trig)
	if err != nil || !again.Existing || again.EventId != wantID {
		t.Fatalf("retried Trigger: %v, %v", again, err)
	}
	// Unset, at is this node's clock.
	if now, err := rc.Trigger(ctx(t), &chimev1.TriggerRecurringRequest{Id: "h"}); err != nil || now.EventId != fmt.Sprintf("h@%d", t0.UnixMilli()) {
		t.Fatalf("Trigger without at: %v, %v", now, err)
	}

	bf := &chimev1.BackfillRecurringRequest{Id: "h", From: timestamppb.New(t0.Add(-10 * time.Hour)), To: timestamppb.New(t0.Add(-5 * time.Hour))}
	b, err := rc.Backfill(ctx(t), bf)
	if err != nil || b.Created != 5 || b.Existing != 0 || len(b.CreatedOccurrences) != 5 || !b.CreatedOccurrences[0].AsTime().Equal(t0.Add(-10*time.Hour)) {
		t.Fatalf("Backfill of five hours: %v, %v", b, err)
	}
	first := fmt.Sprintf("h@%d", t0.Add(-10*time.Hour).UnixMilli())
	if ev, err := sc.Get(ctx(t), &chimev1.GetRequest{Id: first}); err != nil || !ev.Due.AsTime().Equal(t0) {
		t.Fatalf("the first backfilled occurrence, due now: %v, %v", ev, err)
	}
	if b, err := rc.Backfill(ctx(t), bf); err != nil || b.Created != 0 || b.Existing != 5 {
		t.Fatalf("retried Backfill: %v, %v", b, err)
	}

	if g, err := rc.Get(ctx(t), &chimev1.GetRecurringRequest{Id: "h"}); err != nil || g.NextEventId != created.NextEventId || g.Occurrences != 0 {
		t.Fatalf("the schedule after triggers and backfills: %v, %v; want its pending %s untouched", g, err, created.NextEventId)
	}
}

// TestRecurringTriggerAndBackfillRefuseBadInput: each broken Trigger or Backfill is
// INVALID_ARGUMENT naming the field and the rule, and reaches no backend; a range over the
// limit is refused by the shard, with nothing made; a completed schedule is
// FAILED_PRECONDITION.
func TestRecurringTriggerAndBackfillRefuseBadInput(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	rc := chimev1.NewRecurringClient(e.conn)
	if _, err := rc.Create(ctx(t), hourly("h")); err != nil {
		t.Fatal(err)
	}
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	before := proposals(e.backend.Calls())
	for _, c := range []struct {
		name, field, rule string
		call              func() error
	}{
		{"Trigger without an id", "id", "required", func() error { _, err := rc.Trigger(ctx(t), &chimev1.TriggerRecurringRequest{}); return err }},
		{"Trigger of an id with @", "id", `contains "@"`, func() error {
			_, err := rc.Trigger(ctx(t), &chimev1.TriggerRecurringRequest{Id: "h@1"})
			return err
		}},
		{"Trigger at in the future", "at", "more than 1m0s after", func() error {
			_, err := rc.Trigger(ctx(t), &chimev1.TriggerRecurringRequest{Id: "h", At: ts(2 * time.Minute)})
			return err
		}},
		{"Trigger at two days ago", "at", "Backfill makes past occurrences", func() error {
			_, err := rc.Trigger(ctx(t), &chimev1.TriggerRecurringRequest{Id: "h", At: ts(-48 * time.Hour)})
			return err
		}},
		{"Trigger at an invalid time", "at", "not a valid Timestamp", func() error {
			_, err := rc.Trigger(ctx(t), &chimev1.TriggerRecurringRequest{Id: "h", At: &timestamppb.Timestamp{Nanos: -1}})
			return err
		}},
		{"Backfill without from", "from", "required", func() error {
			_, err := rc.Backfill(ctx(t), &chimev1.BackfillRecurringRequest{Id: "h", To: ts(0)})
			return err
		}},
		{"Backfill without to", "to", "required", func() error {
			_, err := rc.Backfill(ctx(t), &chimev1.BackfillRecurringRequest{Id: "h", From: ts(-time.Hour)})
			return err
		}},
		{"Backfill of an empty range", "to", "not after from", func() error {
			_, err := rc.Backfill(ctx(t), &chimev1.BackfillRecurringRequest{Id: "h", From: ts(-time.Hour), To: ts(-time.Hour)})
			return err
		}},
		{"Backfill into the future", "to", "in the future", func() error {
			_, err := rc.Backfill(ctx(t), &chimev1.BackfillRecurringRequest{Id: "h", From: ts(-time.Hour), To: ts(time.Hour)})
			return err
		}},
	} {
		err := c.call()
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), c.field+":") || !strings.Contains(st.Message(), c.rule) {
			t.Errorf("%s: %v %q; want INVALID_ARGUMENT %s: ...%s", c.name, st.Code(), st.Message(), c.field, c.rule)
		}
	}
	if after := proposals(e.backend.Calls()); after != before {
		t.Fatalf("bad input sent %d Recurring commands", after-before)
	}

	// 2,000 hourly instants: over the limit, refused by the shard with nothing made.
	long := hourly("long")
	long.Rule.Start = ts(-3000 * time.Hour)
	if _, err := rc.Create(ctx(t), long); err != nil {
		t.Fatal(err)
	}
	_, err := rc.Backfill(ctx(t), &chimev1.BackfillRecurringRequest{Id: "long", From: ts(-2000 * time.Hour), To: ts(0)})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "to:") || !strings.Contains(st.Message(), "more than 1000") {
		t.Fatalf("Backfill of 2,000 instants: %v", err)
	}
	sc := chimev1.NewSchedulerClient(e.conn)
	if _, err := sc.Get(ctx(t), &chimev1.GetRequest{Id: fmt.Sprintf("long@%d", t0.Add(-2000*time.Hour).UnixMilli())}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused Backfill made an occurrence: %v", err)
	}

	// Unknown and completed schedules.
	if _, err := rc.Trigger(ctx(t), &chimev1.TriggerRecurringRequest{Id: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("Trigger of an unknown schedule: %v", err)
	}
	once := hourly("once")
	once.Rule.Start, once.Rule.MaxOccurrences = ts(30*time.Minute), 1
	if _, err := rc.Create(ctx(t), once); err != nil {
		t.Fatal(err)
	}
	e.backend.FireUntil(t0.Add(2 * time.Hour))
	for name, call := range map[string]func() error{
		"Trigger": func() error { _, err := rc.Trigger(ctx(t), &chimev1.TriggerRecurringRequest{Id: "once"}); return err },
		"Backfill": func() error {
			_, err := rc.Backfill(ctx(t), &chimev1.BackfillRecurringRequest{Id: "once", From: ts(-time.Hour), To: ts(0)})
			return err
		},
	} {
		if st := status.Convert(call()); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "is completed") {
			t.Errorf("%s of a completed schedule: %v %q", name, st.Code(), st.Message())
		}
	}
}

// TestRecurringTriggerAndBackfillAuthorization: both are changes. A reader may not call
// them; a scheduler whose ids are limited to a prefix may act on its own schedules only:
// the shard checks its scope against the schedule as stored.
func TestRecurringTriggerAndBackfillAuthorization(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	entry := func(name, role, extra string) string {
		sum := sha256.Sum256([]byte(name + "-token"))
		return `{"name": "` + name + `", "sha256": "` + hex.EncodeToString(sum[:]) + `", "role": "` + role + `"` + extra + `}`
	}
	if err := os.WriteFile(path, []byte(`{"tokens": [`+entry("ops", "admin", "")+`, `+entry("viewer", "reader", `, "topics": ["*"]`)+`, `+
		entry("billing", "scheduler", `, "topics": ["*"], "id_prefixes": ["billing/"]`)+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, rpc.Limits{}, nil, grpc.ChainUnaryInterceptor(a.UnaryInterceptor))
	rc := chimev1.NewRecurringClient(e.conn)
	as := func(name string) context.Context {
		return metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+name+"-token")
	}
	for _, id := range []string{"billing/h", "other/h"} {
		if _, err := rc.Create(as("ops"), hourly(id)); err != nil {
			t.Fatal(err)
		}
	}
	trigger := func(who, id string) error {
		_, err := rc.Trigger(as(who), &chimev1.TriggerRecurringRequest{Id: id})
		return err
	}
	backfill := func(who, id string) error {
		_, err := rc.Backfill(as(who), &chimev1.BackfillRecurringRequest{Id: id, From: timestamppb.New(t0.Add(-3 * time.Hour)), To: timestamppb.New(t0)})
		return err
	}
	for _, c := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"reader's Trigger", trigger("viewer", "billing/h"), codes.PermissionDenied},
		{"reader's Backfill", backfill("viewer", "billing/h"), codes.PermissionDenied},
		{"scoped scheduler's Trigger of its own", trigger("billing", "billing/h"), codes.OK},
		{"scoped scheduler's Backfill of its own", backfill("billing", "billing/h"), codes.OK},
		{"scoped scheduler's Trigger of another's", trigger("billing", "other/h"), codes.PermissionDenied},
		{"scoped scheduler's Backfill of another's", backfill("billing", "other/h"), codes.PermissionDenied},
		{"admin's Trigger", trigger("ops", "other/h"), codes.OK},
	} {
		if got := status.Code(c.err); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
}
