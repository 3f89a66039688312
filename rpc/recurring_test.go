package rpc_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/auth"
	"github.com/chimehq/chime/rpc/rpctest"
)

func validRecurring() *chimev1.CreateRecurringRequest {
	return &chimev1.CreateRecurringRequest{
		Id:     "nightly-report",
		Rule:   &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Cron{Cron: "30 2 * * *"}, TimeZone: "Europe/Paris"},
		Target: &chimev1.RecurringTarget{Topic: "reports", Payload: []byte("run")},
	}
}

// TestRecurringRefusesBadInput: each broken rule is INVALID_ARGUMENT naming the field, and
// nothing reaches the backend.
func TestRecurringRefusesBadInput(t *testing.T) {
	e := start(t, rpc.Limits{MaxIDBytes: 40, MaxHeaders: 1}, nil)
	rc := chimev1.NewRecurringClient(e.conn)
	for _, c := range []struct {
		field string
		rule  string
		edit  func(r *chimev1.CreateRecurringRequest)
	}{
		{"id", "required", func(r *chimev1.CreateRecurringRequest) { r.Id = "" }},
		{"id", `contains "@"`, func(r *chimev1.CreateRecurringRequest) { r.Id = "a@b" }},
		{"id", "at most 20 allowed", func(r *chimev1.CreateRecurringRequest) { r.Id = strings.Repeat("x", 21) }},
		{"rule", "required", func(r *chimev1.CreateRecurringRequest) { r.Rule = nil }},
		{"rule", "exactly one of cron and every", func(r *chimev1.CreateRecurringRequest) { r.Rule.Rule = nil }},
		{"rule.cron", "expected 5 to 6 fields", func(r *chimev1.CreateRecurringRequest) {
			r.Rule.Rule = &chimev1.RecurringRule_Cron{Cron: "* * *"}
		}},
		{"rule.cron", "matches no date", func(r *chimev1.CreateRecurringRequest) {
			r.Rule.Rule = &chimev1.RecurringRule_Cron{Cron: "0 0 30 2 *"}
		}},
		{"rule.every", "shorter than 1s", func(r *chimev1.CreateRecurringRequest) {
			r.Rule.Rule = &chimev1.RecurringRule_Every{Every: durationpb.New(time.Millisecond)}
		}},
		{"rule.time_zone", "not an IANA time zone name", func(r *chimev1.CreateRecurringRequest) { r.Rule.TimeZone = "Mars/Base" }},
		{"rule.end", "before start", func(r *chimev1.CreateRecurringRequest) {
			r.Rule.Start, r.Rule.End = timestamppb.New(t0.Add(time.Hour)), timestamppb.New(t0)
		}},
		{"rule", "no occurrence after now", func(r *chimev1.CreateRecurringRequest) { r.Rule.End = timestamppb.New(t0.Add(-time.Hour)) }},
		{"rule.jitter", "outside", func(r *chimev1.CreateRecurringRequest) { r.Rule.Jitter = durationpb.New(48 * time.Hour) }},
		{"rule.catch_up", "unknown value", func(r *chimev1.CreateRecurringRequest) { r.Rule.CatchUp = 42 }},
		{"target", "required", func(r *chimev1.CreateRecurringRequest) { r.Target = nil }},
		{"target.topic", "required", func(r *chimev1.CreateRecurringRequest) { r.Target.Topic = "" }},
		{"target.topic", "reserved", func(r *chimev1.CreateRecurringRequest) { r.Target.Topic = "__consumer_offsets" }},
		{"target.headers[0].key", "reserved", func(r *chimev1.CreateRecurringRequest) {
			r.Target.Headers = []*chimev1.Header{{Key: "chime-recurring-id", Value: []byte("x")}}
		}},
		{"target.headers", "at most 1", func(r *chimev1.CreateRecurringRequest) {
			r.Target.Headers = []*chimev1.Header{{Key: "a"}, {Key: "b"}}
		}},
	} {
		req := validRecurring()
		c.edit(req)
		_, err := rc.Create(ctx(t), req)
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), c.field+":") || !strings.Contains(st.Message(), c.rule) {
			t.Errorf("%s (%s): got %v %q", c.field, c.rule, st.Code(), st.Message())
		}
	}
	if calls := e.backend.Calls(); len(calls) != 0 {
		t.Fatalf("bad input reached the backend: %+v", calls)
	}
}

// TestRecurringLifecycle walks the service once over the in-memory backend: Create and its
// idempotency, Get with the upcoming occurrences in the schedule's zone, Update of the
// target alone (the rule kept), Pause, Resume, List with pages, Delete.
func TestRecurringLifecycle(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	rc := chimev1.NewRecurringClient(e.conn)
	req := validRecurring()
	got, err := rc.Create(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	// t0 is 2026-03-01 12:00 UTC; 02:30 in Paris (UTC+1) is 01:30 UTC the next day.
	if got.Version != 1 || got.State != chimev1.RecurringState_RECURRING_STATE_ACTIVE || got.Existing ||
		!got.NextOccurrence.AsTime().Equal(time.Date(2026, 3, 2, 1, 30, 0, 0, time.UTC)) || got.NextEventId != "nightly-report@1772415000000" {
		t.Fatalf("Create: %v", got)
	}
	again, err := rc.Create(ctx(t), req)
	if err != nil || !again.Existing {
		t.Fatalf("re-sent Create: %v, %v", again, err)
	}
	other := proto.Clone(req).(*chimev1.CreateRecurringRequest)
	other.Target.Payload = []byte("other")
	if _, err := rc.Create(ctx(t), other); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("Create with other content: %v", err)
	}

	g, err := rc.Get(ctx(t), &chimev1.GetRecurringRequest{Id: req.Id})
	if err != nil {
		t.Fatal(err)
	}
	// Across the spring-forward on 29 March: 02:30 does not exist there, so that day's
	// occurrence is 03:00 CEST, 01:00 UTC.
	var up []string
	for _, ts := range g.Upcoming {
		up = append(up, ts.AsTime().Format(time.RFC3339))
	}
	if want := "2026-03-02T01:30:00Z 2026-03-03T01:30:00Z 2026-03-04T01:30:00Z 2026-03-05T01:30:00Z 2026-03-06T01:30:00Z"; strings.Join(up, " ") != want {
		t.Fatalf("upcoming %v, want %s", up, want)
	}

	upd, err := rc.Update(ctx(t), &chimev1.UpdateRecurringRequest{Id: req.Id, Target: &chimev1.RecurringTarget{Topic: "reports-v2"}})
	if err != nil || upd.Version != 2 || upd.Target.Topic != "reports-v2" || upd.Rule.GetCron() != "30 2 * * *" || upd.Rule.TimeZone != "Europe/Paris" {
		t.Fatalf("Update of the target: %v, %v", upd, err)
	}
	if _, err := rc.Update(ctx(t), &chimev1.UpdateRecurringRequest{Id: req.Id, Target: req.Target, ExpectedVersion: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Update at a past version: %v", err)
	}
	if _, err := rc.Update(ctx(t), &chimev1.UpdateRecurringRequest{Id: req.Id}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Update of nothing: %v", err)
	}
	if _, err := rc.Update(ctx(t), &chimev1.UpdateRecurringRequest{Id: "nope", Target: req.Target}); status.Code(err) != codes.NotFound {
		t.Fatalf("Update of an unknown schedule: %v", err)
	}

	if _, err := rc.Resume(ctx(t), &chimev1.ResumeRecurringRequest{Id: req.Id}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Resume of an active schedule: %v", err)
	}
	p, err := rc.Pause(ctx(t), &chimev1.PauseRecurringRequest{Id: req.Id})
	if err != nil || p.State != chimev1.RecurringState_RECURRING_STATE_PAUSED || p.NextOccurrence != nil {
		t.Fatalf("Pause: %v, %v", p, err)
	}
	r, err := rc.Resume(ctx(t), &chimev1.ResumeRecurringRequest{Id: req.Id})
	if err != nil || r.State != chimev1.RecurringState_RECURRING_STATE_ACTIVE || r.NextOccurrence == nil {
		t.Fatalf("Resume: %v, %v", r, err)
	}

	for _, id := range []string{"a-1", "a-2", "a-3", "b-1"} {
		c := validRecurring()
		c.Id = id
		if _, err := rc.Create(ctx(t), c); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	tok := ""
	for page := 0; ; page++ {
		l, err := rc.List(ctx(t), &chimev1.ListRecurringRequest{IdPrefix: "a-", Limit: 2, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range l.Schedules {
			ids = append(ids, s.Id)
		}
		if tok = l.NextPageToken; tok == "" {
			break
		}
		if page > 3 {
			t.Fatal("List does not end")
		}
	}
	if strings.Join(ids, " ") != "a-1 a-2 a-3" {
		t.Fatalf("List a-: %v", ids)
	}
	if _, err := rc.List(ctx(t), &chimev1.ListRecurringRequest{PageToken: "garbage"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("List with a bad token: %v", err)
	}

	if _, err := rc.Delete(ctx(t), &chimev1.DeleteRecurringRequest{Id: req.Id}); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Get(ctx(t), &chimev1.GetRecurringRequest{Id: req.Id}); status.Code(err) != codes.NotFound {
		t.Fatalf("Get after Delete: %v", err)
	}
	if _, err := rc.Delete(ctx(t), &chimev1.DeleteRecurringRequest{Id: req.Id}); status.Code(err) != codes.NotFound {
		t.Fatalf("Delete again: %v", err)
	}
}

// TestRecurringRefusals: each refused Recurring call gets its code. One
// refused for its id, and an Update that the read it merges into already
// decides, send no Recurring command to the backend; the others are
// decided by the shard leader's read, which proposes nothing for them
// either (the shard's own tests count its applied index).
func TestRecurringRefusals(t *testing.T) {
	e := start(t, rpc.Limits{MaxIDBytes: 40}, nil)
	rc := chimev1.NewRecurringClient(e.conn)
	req := validRecurring()
	if _, err := rc.Create(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 100)
	for _, c := range []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"Resume of an unknown id", func() error { _, err := rc.Resume(ctx(t), &chimev1.ResumeRecurringRequest{Id: "nope"}); return err }, codes.NotFound},
		{"Resume of an over-long id", func() error { _, err := rc.Resume(ctx(t), &chimev1.ResumeRecurringRequest{Id: long}); return err }, codes.InvalidArgument},
		{"Resume of an active schedule", func() error { _, err := rc.Resume(ctx(t), &chimev1.ResumeRecurringRequest{Id: req.Id}); return err }, codes.FailedPrecondition},
		{"Pause of an unknown id", func() error { _, err := rc.Pause(ctx(t), &chimev1.PauseRecurringRequest{Id: "nope"}); return err }, codes.NotFound},
		{"Pause of an id with @", func() error { _, err := rc.Pause(ctx(t), &chimev1.PauseRecurringRequest{Id: "a@1"}); return err }, codes.InvalidArgument},
		{"Delete of an unknown id", func() error { _, err := rc.Delete(ctx(t), &chimev1.DeleteRecurringRequest{Id: "nope"}); return err }, codes.NotFound},
		{"Delete at another version", func() error {
			_, err := rc.Delete(ctx(t), &chimev1.DeleteRecurringRequest{Id: req.Id, ExpectedVersion: 7})
			return err
		}, codes.FailedPrecondition},
		{"Update of an unknown id", func() error {
			_, err := rc.Update(ctx(t), &chimev1.UpdateRecurringRequest{Id: "nope", Rule: req.Rule, Target: req.Target})
			return err
		}, codes.NotFound},
		{"Update of an over-long id", func() error {
			_, err := rc.Update(ctx(t), &chimev1.UpdateRecurringRequest{Id: long, Target: req.Target})
			return err
		}, codes.InvalidArgument},
		{"Update at another version", func() error {
			_, err := rc.Update(ctx(t), &chimev1.UpdateRecurringRequest{Id: req.Id, Rule: req.Rule, Target: req.Target, ExpectedVersion: 7})
			return err
		}, codes.FailedPrecondition},
		{"Get of an over-long id", func() error { _, err := rc.Get(ctx(t), &chimev1.GetRecurringRequest{Id: long}); return err }, codes.InvalidArgument},
	} {
		before := proposals(e.backend.Calls())
		if err := c.call(); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
		if after := proposals(e.backend.Calls()); after != before && (c.code == codes.InvalidArgument || strings.HasPrefix(c.name, "Update")) {
			t.Errorf("%s: sent a Recurring command", c.name)
		}
	}
	// A Pause of a paused schedule changes nothing, and is answered so.
	if _, err := rc.Pause(ctx(t), &chimev1.PauseRecurringRequest{Id: req.Id}); err != nil {
		t.Fatal(err)
	}
	if p, err := rc.Pause(ctx(t), &chimev1.PauseRecurringRequest{Id: req.Id}); err != nil || p.State != chimev1.RecurringState_RECURRING_STATE_PAUSED {
		t.Fatalf("second Pause: %v, %v", p, err)
	}
}

// proposals counts the Recurring commands among calls.
func proposals(calls []rpctest.Call) int {
	n := 0
	for _, c := range calls {
		if c.Method == "Recurring" {
			n++
		}
	}
	return n
}

// TestRecurringMinInterval: a credential with a min_interval cannot create
// or update a schedule whose occurrences come closer together, cron or
// every; the refusal names the gap, the credential and its bound.
func TestRecurringMinInterval(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	sum := sha256.Sum256([]byte("hourly-token"))
	if err := os.WriteFile(path, []byte(`{"tokens": [{"name": "hourly", "sha256": "`+hex.EncodeToString(sum[:])+
		`", "role": "scheduler", "topics": ["*"], "min_interval": "1h"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, rpc.Limits{}, nil, grpc.ChainUnaryInterceptor(a.UnaryInterceptor))
	rc := chimev1.NewRecurringClient(e.conn)
	call := metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer hourly-token")
	for _, c := range []struct {
		rule *chimev1.RecurringRule
		want string // "" when allowed
	}{
		{&chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Minute)}}, `rule: occurs 1m0s apart`},
		{&chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Cron{Cron: "*/30 * * * *"}}, `rule: occurs 30m0s apart`},
		// Twice an hour, but 5 minutes apart each time.
		{&chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Cron{Cron: "0,5 * * * *"}}, `rule: occurs 5m0s apart`},
		{&chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Cron{Cron: "0 * * * *"}}, ""},
		{&chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(2 * time.Hour)}}, ""},
	} {
		req := validRecurring()
		req.Id, req.Rule = "hourly-"+strings.NewReplacer(" ", "", "*", "x", "/", "-", ",", "-").Replace(c.rule.String()), c.rule
		_, err := rc.Create(call, req)
		if c.want == "" {
			if err != nil {
				t.Errorf("%v: %v", c.rule, err)
			}
			continue
		}
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `credential "hourly"'s min_interval of 1h0m0s`) {
			t.Errorf("%v: %v; want PERMISSION_DENIED %q", c.rule, err, c.want)
		}
	}
	// An update to a finer rule is held to it too.
	req := validRecurring()
	req.Id = "hourly-update"
	req.Rule = &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Cron{Cron: "0 * * * *"}}
	if _, err := rc.Create(call, req); err != nil {
		t.Fatal(err)
	}
	_, err = rc.Update(call, &chimev1.UpdateRecurringRequest{Id: req.Id, Rule: &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Second)}}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("an update to every second: %v", err)
	}
}
