package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// TestTenantsCannotTouchEachOther runs three secured chimed processes shared
// by tenants, each with a scheduler token limited to its topics: A and B
// with id prefixes of their own, C with none (so that only the check on the
// stored event stands between C and B's ids). Every way another tenant's
// event or schedule could be taken over, changed, cancelled, read or told
// apart from a missing one is tried, through every node (so that most calls
// are forwarded to the shard's leader), and each is refused with the same
// words, naming no topic; B's event fires untouched, on its topic, with its
// payload, and B's schedule keeps occurring.
func TestTenantsCannotTouchEachOther(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-process secured cluster; skipped with -short")
	}
	t.Parallel()
	p := newSecurePKI(t)
	clientCA := p.dir + "/client-ca.pem"
	copyFile(t, p.clients.File, clientCA)
	admin, err := p.clients.Client("admin-app")
	if err != nil {
		t.Fatal(err)
	}
	authFile := p.dir + "/auth.json"
	copyFileContent(t, authFile, fmt.Sprintf(`{
  "tokens": [
    {"name": "tenant-a", "sha256": "%s", "role": "scheduler", "topics": ["a.*"], "id_prefixes": ["a-"]},
    {"name": "tenant-b", "sha256": "%s", "role": "scheduler", "topics": ["b.*"], "id_prefixes": ["b-"]},
    {"name": "tenant-c", "sha256": "%s", "role": "scheduler", "topics": ["c.*"]},
    {"name": "reader-a", "sha256": "%s", "role": "reader", "topics": ["a.*"], "id_prefixes": ["a-"]}
  ],
  "certificates": [{"name": "test-admin", "common_name": "admin-app", "role": "admin"}]
}`, sha256Hex("token-a"), sha256Hex("token-b"), sha256Hex("token-c"), sha256Hex("token-reader-a")))
	c := &cluster{t: t, brokers: broker(t), nodes: map[string]*daemon{}}
	for _, id := range []string{"n1", "n2", "n3"} {
		c.addWith(id, func(d *daemon) { p.secure(t, d, clientCA, authFile, admin) })
	}
	c.waitConverged(60 * time.Second)
	got := collect(t, c.brokers, "b.orders", "a.x", "c.x")

	call := func(token string) (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		return withToken(ctx, token), cancel
	}
	n1 := c.nodes["n1"]
	ctx, cancel := call("token-b")
	due := time.Now().Add(8 * time.Second)
	if _, err := n1.client().Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
		Id: "b-1", Topic: "b.orders", Payload: []byte("b's order"), Delay: durationpb.New(time.Until(due))}}); err != nil {
		t.Fatalf("tenant B's Schedule: %v", err)
	}
	if _, err := n1.recurring().Create(ctx, &chimev1.CreateRecurringRequest{Id: "b-beat",
		Rule:   &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Second)}},
		Target: &chimev1.RecurringTarget{Topic: "b.orders", Payload: []byte("beat")}}); err != nil {
		t.Fatalf("tenant B's recurring Create: %v", err)
	}
	cancel()

	// refused checks one attack: PERMISSION_DENIED in exactly the words
	// that a missing id would get too, with nothing of B's in them.
	refused := func(what, tenant string, err error) {
		t.Helper()
		id := "b-1"
		if strings.Contains(what, "schedule") {
			id = "b-beat"
		}
		want := fmt.Sprintf("id %q: not permitted for credential %q", id, tenant)
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.PermissionDenied || msg != want {
			t.Errorf("%s by %s: %v; want PERMISSION_DENIED %q", what, tenant, err, want)
		}
		if strings.Contains(msg, "b.orders") {
			t.Errorf("%s by %s: the refusal names B's topic: %q", what, tenant, msg)
		}
	}
	for i, tenant := range []string{"tenant-a", "tenant-c", "tenant-a", "tenant-c", "tenant-c", "tenant-a"} {
		d := c.nodes[c.order[i%3]] // through every node: some calls are forwarded
		token := "token-" + tenant[len(tenant)-1:]
		topic := tenant[len(tenant)-1:] + ".x"
		sc, rc := d.client(), d.recurring()
		ctx, cancel := call(token)
		_, err := sc.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
			Id: "b-1", Topic: topic, Payload: []byte("takeover"), Delay: durationpb.New(time.Second), OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE}})
		refused("upsert of B's event", tenant, err)
		_, err = sc.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: "b-1", Topic: topic, Payload: []byte("squat"), Delay: durationpb.New(time.Hour)}})
		refused("a create that collides with B's event", tenant, err)
		_, err = sc.Update(ctx, &chimev1.UpdateRequest{Id: "b-1", Payload: []byte("changed")})
		refused("update of B's event", tenant, err)
		_, err = sc.Cancel(ctx, &chimev1.CancelRequest{Id: "b-1"})
		refused("cancel of B's event", tenant, err)
		_, err = sc.Get(ctx, &chimev1.GetRequest{Id: "b-1"})
		refused("get of B's event", tenant, err)
		_, err = rc.Get(ctx, &chimev1.GetRecurringRequest{Id: "b-beat"})
		refused("get of B's schedule", tenant, err)
		_, err = rc.Pause(ctx, &chimev1.PauseRecurringRequest{Id: "b-beat"})
		refused("pause of B's schedule", tenant, err)
		_, err = rc.Resume(ctx, &chimev1.ResumeRecurringRequest{Id: "b-beat"})
		refused("resume of B's schedule", tenant, err)
		_, err = rc.Update(ctx, &chimev1.UpdateRecurringRequest{Id: "b-beat", Target: &chimev1.RecurringTarget{Topic: topic, Payload: []byte("mine")}})
		refused("update of B's schedule", tenant, err)
		_, err = rc.Delete(ctx, &chimev1.DeleteRecurringRequest{Id: "b-beat"})
		refused("delete of B's schedule", tenant, err)
		_, err = rc.Create(ctx, &chimev1.CreateRecurringRequest{Id: "b-beat",
			Rule:   &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Minute)}},
			Target: &chimev1.RecurringTarget{Topic: topic}})
		refused("a create that collides with B's schedule", tenant, err)
		list, err := rc.List(ctx, &chimev1.ListRecurringRequest{IdPrefix: tenant[len(tenant)-1:] + "-"})
		if tenant == "tenant-c" {
			list, err = rc.List(ctx, &chimev1.ListRecurringRequest{})
		}
		if err == nil {
			for _, s := range list.Schedules {
				if s.Id == "b-beat" {
					t.Errorf("%s lists B's schedule", tenant)
				}
			}
		}
		cancel()
	}
	// A reader scoped to A's topics and ids reads none of B's.
	ctx, cancel = call("token-reader-a")
	_, err = n1.client().Get(ctx, &chimev1.GetRequest{Id: "b-1"})
	refused("get of B's event", "reader-a", err)
	_, err = n1.client().List(ctx, &chimev1.ListRequest{Filter: &chimev1.EventFilter{Topic: "b.orders", IdPrefix: "a-"}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("reader-a listing B's topic: %v, want PERMISSION_DENIED", err)
	}
	_, err = n1.recurring().Get(ctx, &chimev1.GetRecurringRequest{Id: "b-beat"})
	refused("get of B's schedule", "reader-a", err)
	cancel()
	// An unknown id of C's own reads as NOT_FOUND, and C's own event works.
	ctx, cancel = call("token-c")
	if _, err := n1.client().Get(ctx, &chimev1.GetRequest{Id: "c-404"}); status.Code(err) != codes.NotFound {
		t.Errorf("tenant C's Get of an unknown id: %v, want NOT_FOUND", err)
	}
	if _, err := n1.client().Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: "c-1", Topic: "c.x", Delay: durationpb.New(time.Second), OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE}}); err != nil {
		t.Errorf("tenant C's own upsert: %v", err)
	}
	cancel()

	// B's event fires as B scheduled it, and B still reads it.
	got.waitIDs(t, map[string]time.Time{"b-1": due, "c-1": time.Now()}, 30*time.Second)
	r, _ := got.byID()
	if b := r["b-1"]; b.Kafka.Topic != "b.orders" || b.Value() != "b's order" || b.Version != 1 || b.Fired.Before(due.Truncate(time.Millisecond)) {
		t.Errorf("B's event fired as %s %q version %d at %v (due %v); want it untouched", b.Kafka.Topic, b.Value(), b.Version, b.Fired, due)
	}
	for id, rec := range r {
		if strings.HasPrefix(id, "b-") && rec.Kafka.Topic != "b.orders" {
			t.Errorf("B's %s fired on %s", id, rec.Kafka.Topic)
		}
	}
	ctx, cancel = call("token-b")
	defer cancel()
	// The record is in Kafka; its MarkFired commits just after.
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		g, err := n1.client().Get(ctx, &chimev1.GetRequest{Id: "b-1"})
		return err == nil && g.State == chimev1.EventState_EVENT_STATE_FIRED, fmt.Sprintf("tenant B's own Get shows b-1 fired: %v, %v", g, err)
	})
	if s, err := n1.recurring().Get(ctx, &chimev1.GetRecurringRequest{Id: "b-beat"}); err != nil || s.State != chimev1.RecurringState_RECURRING_STATE_ACTIVE || s.Version != 1 {
		t.Errorf("tenant B's schedule after the attacks: %v, %v", s, err)
	}
	if t.Failed() {
		for _, id := range c.order {
			t.Logf("%s stderr:\n%s", id, tail(c.nodes[id].stderr.String(), 3000))
		}
	}
}
