package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/certs"
)

func hash(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

const testFile = `{
  "tokens": [
    {"name": "ops", "sha256": "%s", "role": "admin"},
    {"name": "billing", "sha256": "%s", "role": "scheduler", "topics": ["billing.*"], "id_prefixes": ["inv-"]},
    {"name": "any-topic", "sha256": "%s", "role": "scheduler", "topics": ["*"]},
    {"name": "dash", "sha256": "%s", "role": "reader"},
    {"name": "billing-dash", "sha256": "%s", "role": "reader", "topics": ["billing.*"], "id_prefixes": ["inv-"]}
  ],
  "certificates": [
    {"name": "app", "common_name": "app-1", "role": "scheduler", "topics": ["reminders"]}
  ]
}`

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

type fixture struct {
	a     *Authorizer
	audit *bytes.Buffer
	now   time.Time
	path  string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{audit: &bytes.Buffer{}, now: time.Unix(1e9, 0), path: filepath.Join(t.TempDir(), "auth.json")}
	writeFile(t, f.path, fmt.Sprintf(testFile, hash("ops-token"), hash("billing-token"), hash("any-token"), hash("dash-token"), hash("bdash-token")))
	a, err := New(Options{Path: f.path, Audit: f.audit, Now: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	f.a = a
	return f
}

// ctx is a call's context: a token (if not empty) and a certificate
// identity.
func callCtx(token string, id certs.Identity) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 5}, AuthInfo: certs.AuthInfo{Identity: id}})
	if token != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
	}
	return ctx
}

func (f *fixture) call(ctx context.Context, method string, req any) error {
	_, err := f.scopedCall(ctx, method, req)
	return err
}

// callWant makes a call and fails t unless it ends with want: a test of
// the audit log checks each line against what its caller got.
func (f *fixture) callWant(t *testing.T, ctx context.Context, method string, req any, want codes.Code) {
	t.Helper()
	if err := f.call(ctx, method, req); status.Code(err) != want {
		t.Fatalf("%s: %v, want %v", method, err, want)
	}
}

// scopedCall makes a call and returns the Scope its handler saw.
func (f *fixture) scopedCall(ctx context.Context, method string, req any) (*Grant, error) {
	var scope *Grant
	_, err := f.a.UnaryInterceptor(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, _ any) (any, error) {
		scope = Scope(ctx)
		return "ok", nil
	})
	return scope, err
}

func TestRoles(t *testing.T) {
	f := newFixture(t)
	sched := func(topic, id string) *chimev1.ScheduleRequest {
		return &chimev1.ScheduleRequest{Event: &chimev1.Event{Topic: topic, Id: id}}
	}
	node := certs.Identity{Node: true, Name: "n2"}
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		method string
		req    any
		want   codes.Code
		msg    string // in the error
	}{
		{"no credentials", callCtx("", certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"}, codes.Unauthenticated, "no credentials"},
		{"unknown token", callCtx("guess", certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"}, codes.Unauthenticated, "not in the node's auth file"},
		{"unlisted certificate", callCtx("", certs.Identity{Cert: true, Name: "app-9"}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{}, codes.Unauthenticated, `"app-9" has no role`},
		{"reader gets", callCtx("dash-token", certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "inv-2"}, codes.OK, ""},
		{"reader lists", callCtx("dash-token", certs.Identity{}), chimev1.Scheduler_List_FullMethodName, &chimev1.ListRequest{}, codes.OK, ""},
		{"reader schedules", callCtx("dash-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, sched("billing.x", "inv-3"), codes.PermissionDenied, "needs the scheduler or admin role"},
		{"reader cancels", callCtx("dash-token", certs.Identity{}), chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: "inv-1"}, codes.PermissionDenied, "dash"},
		{"scheduler in its topic", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, sched("billing.invoices", "inv-3"), codes.OK, ""},
		{"scheduler outside its topics", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, sched("payroll", "inv-3"), codes.PermissionDenied, `event.topic: "payroll" is outside "billing"'s topics`},
		{"scheduler outside its id prefixes", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, sched("billing.x", "order-1"), codes.PermissionDenied, `id "order-1": not permitted for credential "billing"`},
		{"scheduler without an id", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, sched("billing.x", ""), codes.PermissionDenied, "event.id: required"},
		{"scheduler batch, one outside", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_BatchSchedule_FullMethodName,
			&chimev1.BatchScheduleRequest{Events: []*chimev1.Event{{Topic: "billing.a", Id: "inv-5"}, {Topic: "hr", Id: "inv-6"}}}, codes.PermissionDenied, "events[1].topic"},
		{"scheduler cancels its event", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: "inv-1"}, codes.OK, ""},
		{"scheduler cancels outside its id prefixes", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: "order-2"}, codes.PermissionDenied, `id "order-2": not permitted for credential "billing"`},
		{"scheduler gets outside its id prefixes", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "order-2"}, codes.PermissionDenied, `id "order-2": not permitted for credential "billing"`},
		{"scoped reader gets outside its id prefixes", callCtx("bdash-token", certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "order-2"}, codes.PermissionDenied, `not permitted for credential "billing-dash"`},
		{"scoped reader lists another topic", callCtx("bdash-token", certs.Identity{}), chimev1.Scheduler_List_FullMethodName,
			&chimev1.ListRequest{Filter: &chimev1.EventFilter{Topic: "payroll", IdPrefix: "inv-"}}, codes.PermissionDenied, "filter.topic"},
		{"scoped reader lists its own", callCtx("bdash-token", certs.Identity{}), chimev1.Scheduler_List_FullMethodName,
			&chimev1.ListRequest{Filter: &chimev1.EventFilter{Topic: "billing.a", IdPrefix: "inv-"}}, codes.OK, ""},
		{"scoped reader lists schedules outside its prefixes", callCtx("bdash-token", certs.Identity{}), chimev1.Recurring_List_FullMethodName,
			&chimev1.ListRecurringRequest{IdPrefix: "rep-"}, codes.PermissionDenied, "id_prefix"},
		{"scoped reader gets a schedule outside its prefixes", callCtx("bdash-token", certs.Identity{}), chimev1.Recurring_Get_FullMethodName,
			&chimev1.GetRecurringRequest{Id: "rep-1"}, codes.PermissionDenied, `id "rep-1": not permitted`},
		{"scoped reader cancels", callCtx("bdash-token", certs.Identity{}), chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: "inv-1"}, codes.PermissionDenied, "needs the scheduler or admin role"},
		{"scheduler updates a missing event", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Update_FullMethodName, &chimev1.UpdateRequest{Id: "inv-404"}, codes.OK, ""},
		{"scheduler lists without its topic", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_List_FullMethodName, &chimev1.ListRequest{}, codes.PermissionDenied, "filter.topic"},
		{"scheduler lists its topic outside its prefixes", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Count_FullMethodName,
			&chimev1.CountRequest{Filter: &chimev1.EventFilter{Topic: "billing.a"}}, codes.PermissionDenied, "filter.id_prefix"},
		{"scheduler lists within", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Count_FullMethodName,
			&chimev1.CountRequest{Filter: &chimev1.EventFilter{Topic: "billing.a", IdPrefix: "inv-4"}}, codes.OK, ""},
		{"every-topic scheduler lists all", callCtx("any-token", certs.Identity{}), chimev1.Scheduler_List_FullMethodName, &chimev1.ListRequest{}, codes.OK, ""},
		{"reader reads the cluster map", callCtx("dash-token", certs.Identity{}), chimev1.Admin_GetClusterMap_FullMethodName, &chimev1.GetClusterMapRequest{}, codes.OK, ""},
		{"scheduler drains", callCtx("billing-token", certs.Identity{}), chimev1.Admin_Drain_FullMethodName, &chimev1.DrainRequest{}, codes.PermissionDenied, "needs the admin role"},
		{"scheduler calls Peer", callCtx("any-token", certs.Identity{}), chimev1.Peer_Forget_FullMethodName, &chimev1.ForgetRequest{}, codes.PermissionDenied, "for nodes"},
		{"admin drains", callCtx("ops-token", certs.Identity{}), chimev1.Admin_Drain_FullMethodName, &chimev1.DrainRequest{}, codes.OK, ""},
		{"admin schedules anywhere", callCtx("ops-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, sched("payroll", ""), codes.OK, ""},
		{"admin cannot call Peer", callCtx("ops-token", certs.Identity{}), chimev1.Peer_Replicas_FullMethodName, &chimev1.ReplicasRequest{}, codes.PermissionDenied, "for nodes"},
		{"certificate scheduler", callCtx("", certs.Identity{Cert: true, Name: "app-1"}), chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: "r-1"}, codes.OK, ""},
		{"a token beats the certificate", callCtx("dash-token", certs.Identity{Cert: true, Name: "app-1"}), chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: "r-1"}, codes.PermissionDenied, "dash"},
		{"node calls Peer", callCtx("", node), chimev1.Peer_Forget_FullMethodName, &chimev1.ForgetRequest{}, codes.OK, ""},
		{"node relays anything", callCtx("", node), chimev1.Scheduler_Schedule_FullMethodName, sched("payroll", "x"), codes.OK, ""},
		{"reader gets a schedule", callCtx("dash-token", certs.Identity{}), chimev1.Recurring_Get_FullMethodName, &chimev1.GetRecurringRequest{Id: "inv-r2"}, codes.OK, ""},
		{"reader creates a schedule", callCtx("dash-token", certs.Identity{}), chimev1.Recurring_Create_FullMethodName,
			&chimev1.CreateRecurringRequest{Id: "inv-r3", Target: &chimev1.RecurringTarget{Topic: "billing.x"}}, codes.PermissionDenied, "(Get and List only)"},
		{"scheduler creates a schedule in its topic", callCtx("billing-token", certs.Identity{}), chimev1.Recurring_Create_FullMethodName,
			&chimev1.CreateRecurringRequest{Id: "inv-r3", Target: &chimev1.RecurringTarget{Topic: "billing.x"}}, codes.OK, ""},
		{"scheduler creates a schedule outside its topics", callCtx("billing-token", certs.Identity{}), chimev1.Recurring_Create_FullMethodName,
			&chimev1.CreateRecurringRequest{Id: "inv-r3", Target: &chimev1.RecurringTarget{Topic: "payroll"}}, codes.PermissionDenied, "target.topic"},
		{"scheduler creates a schedule outside its id prefixes", callCtx("billing-token", certs.Identity{}), chimev1.Recurring_Create_FullMethodName,
			&chimev1.CreateRecurringRequest{Id: "rep-1", Target: &chimev1.RecurringTarget{Topic: "billing.x"}}, codes.PermissionDenied, `id "rep-1": not permitted for credential "billing"`},
		{"scheduler deletes its schedule", callCtx("billing-token", certs.Identity{}), chimev1.Recurring_Delete_FullMethodName, &chimev1.DeleteRecurringRequest{Id: "inv-r1"}, codes.OK, ""},
		{"scheduler pauses outside its prefixes", callCtx("billing-token", certs.Identity{}), chimev1.Recurring_Pause_FullMethodName,
			&chimev1.PauseRecurringRequest{Id: "rep-2"}, codes.PermissionDenied, `id "rep-2": not permitted`},
		{"scheduler moves its schedule to another topic", callCtx("billing-token", certs.Identity{}), chimev1.Recurring_Update_FullMethodName,
			&chimev1.UpdateRecurringRequest{Id: "inv-r1", Target: &chimev1.RecurringTarget{Topic: "payroll"}}, codes.PermissionDenied, "target.topic"},
		{"unknown method", callCtx("billing-token", certs.Identity{}), "/other.v1.X/Y", nil, codes.PermissionDenied, "only an admin"},
		{"reflection", callCtx("dash-token", certs.Identity{}), "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", nil, codes.OK, ""},
	} {
		err := f.call(tc.ctx, tc.method, tc.req)
		if status.Code(err) != tc.want || (tc.msg != "" && !strings.Contains(err.Error(), tc.msg)) {
			t.Errorf("%s: %v; want %v with %q", tc.name, err, tc.want, tc.msg)
		}
	}
}

func TestAuditLog(t *testing.T) {
	f := newFixture(t)
	f.callWant(t, callCtx("ops-token", certs.Identity{}), chimev1.Admin_Drain_FullMethodName, &chimev1.DrainRequest{}, codes.OK)
	f.callWant(t, callCtx("", certs.Identity{Node: true, Name: "n2"}), chimev1.Admin_NodeStatus_FullMethodName, &chimev1.NodeStatusRequest{}, codes.OK)
	f.callWant(t, metadata.NewIncomingContext(callCtx("", certs.Identity{Node: true, Name: "n3"}), metadata.Pairs(chimev1.ForwardedMetadata, "1")),
		chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"}, codes.OK)
	f.callWant(t, callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, &chimev1.ScheduleRequest{Event: &chimev1.Event{Topic: "billing.a", Id: "inv-1"}}, codes.OK)
	f.callWant(t, callCtx("dash-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, &chimev1.ScheduleRequest{Event: &chimev1.Event{}}, codes.PermissionDenied)
	f.callWant(t, callCtx("", certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{}, codes.Unauthenticated)
	var lines []auditLine
	for _, l := range strings.Split(strings.TrimSpace(f.audit.String()), "\n") {
		var al auditLine
		if err := json.Unmarshal([]byte(l), &al); err != nil {
			t.Fatalf("audit line %q: %v", l, err)
		}
		lines = append(lines, al)
	}
	// The admin's Drain, the node's NodeStatus on its own behalf (a node
	// certificate skips every role), the reader's refused Schedule and the
	// anonymous Get; not a call a node forwarded, nor the allowed Schedule.
	want := []struct{ who, method, result string }{
		{"ops", chimev1.Admin_Drain_FullMethodName, "OK"},
		{"node n2", chimev1.Admin_NodeStatus_FullMethodName, "OK"},
		{"dash", chimev1.Scheduler_Schedule_FullMethodName, "PermissionDenied"},
		{"anonymous", chimev1.Scheduler_Get_FullMethodName, "Unauthenticated"},
	}
	if len(lines) != len(want) {
		t.Fatalf("audit log:\n%s\nwant %d lines", f.audit, len(want))
	}
	for i, w := range want {
		l := lines[i]
		if l.Who != w.who || l.Method != w.method || l.Result != w.result || l.Peer != "10.0.0.9:5" || l.Time == "" {
			t.Errorf("audit line %d: %+v, want %+v", i, l, w)
		}
	}
	for _, tok := range []string{"ops-token", "billing-token", "dash-token"} {
		if strings.Contains(f.audit.String(), tok) {
			t.Errorf("token %s reached the audit log:\n%s", tok, f.audit)
		}
	}
}

// TestScopeTravelsWithTheCall: the handler sees the grant that limits the
// caller, also when a node forwards the call for it; nothing limits an
// admin, a grant of every topic and id, or a node acting for itself.
func TestScopeTravelsWithTheCall(t *testing.T) {
	f := newFixture(t)
	node := certs.Identity{Node: true, Name: "n2"}
	forwarded := func(cred string) context.Context {
		md := metadata.Pairs(chimev1.ForwardedMetadata, "1")
		if cred != "" {
			md.Append(chimev1.CredentialMetadata, cred)
		}
		return metadata.NewIncomingContext(callCtx("", node), md)
	}
	get := &chimev1.GetRequest{Id: "inv-1"}
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		scope string // the grant's name, "" for none
		code  codes.Code
	}{
		{"scheduler", callCtx("billing-token", certs.Identity{}), "billing", codes.OK},
		{"topic-limited certificate", callCtx("", certs.Identity{Cert: true, Name: "app-1"}), "app", codes.OK},
		{"scoped reader", callCtx("bdash-token", certs.Identity{}), "billing-dash", codes.OK},
		{"reader of everything", callCtx("dash-token", certs.Identity{}), "", codes.OK},
		{"every topic and id", callCtx("any-token", certs.Identity{}), "", codes.OK},
		{"admin", callCtx("ops-token", certs.Identity{}), "", codes.OK},
		{"node for itself", callCtx("", node), "", codes.OK},
		{"node forwarding billing's call", forwarded("billing"), "billing", codes.OK},
		{"node forwarding an unscoped call", forwarded(""), "", codes.OK},
		{"node forwarding an unknown credential", forwarded("nobody"), "", codes.Unauthenticated},
		{"a client claiming a credential", metadata.NewIncomingContext(callCtx("any-token", certs.Identity{}),
			metadata.Pairs("authorization", "Bearer any-token", chimev1.ForwardedMetadata, "1", chimev1.CredentialMetadata, "billing")), "", codes.OK},
	} {
		scope, err := f.scopedCall(tc.ctx, chimev1.Scheduler_Get_FullMethodName, get)
		name := ""
		if scope != nil {
			name = scope.Name
		}
		if status.Code(err) != tc.code || name != tc.scope {
			t.Errorf("%s: scope %q, %v; want %q, %v", tc.name, name, err, tc.scope, tc.code)
		}
	}

	// A request a node forwards to its shard's leader through Peer carries
	// the grant the same way, and a client still may not call Peer.
	scope, err := f.scopedCall(forwarded("billing"), chimev1.Peer_ShardSchedule_FullMethodName, &chimev1.ShardScheduleRequest{})
	if err != nil || scope == nil || scope.Name != "billing" {
		t.Errorf("a node's Peer call for billing: scope %v, %v; want billing's", scope, err)
	}
	if _, err := f.scopedCall(callCtx("billing-token", certs.Identity{}), chimev1.Peer_ShardSchedule_FullMethodName, &chimev1.ShardScheduleRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("billing calling Peer itself: %v; want PERMISSION_DENIED", err)
	}

	// What a scope permits: its id prefixes and its topics.
	g := f.a.table().byName["billing"]
	for _, c := range []struct {
		id, topic string
		want      bool
	}{{"inv-1", "billing.a", true}, {"inv-1", "payroll", false}, {"order-1", "billing.a", false}} {
		if got := g.Permits(c.id, c.topic); got != c.want {
			t.Errorf("billing permits (%q, %q) = %v", c.id, c.topic, got)
		}
	}
}

func TestReloadRotatesTokens(t *testing.T) {
	f := newFixture(t)
	get := func(tok string) error {
		return f.call(callCtx(tok, certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"})
	}
	if err := get("dash-token"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.path, fmt.Sprintf(`{"tokens": [{"name": "dash", "sha256": "%s", "role": "reader"}]}`, hash("dash-token-2")))
	if err := get("dash-token"); err != nil {
		t.Fatalf("the file was read again before a second passed: %v", err)
	}
	f.now = f.now.Add(reloadEvery)
	if err := get("dash-token-2"); err != nil {
		t.Fatalf("the new token: %v", err)
	}
	if err := get("dash-token"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the revoked token: %v", err)
	}
	writeFile(t, f.path, `{"tokens": [`)
	f.now = f.now.Add(reloadEvery)
	if err := get("dash-token-2"); err != nil {
		t.Fatalf("a broken file replaced the table in force: %v", err)
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	h := hash("t")
	for _, tc := range []struct{ file, want string }{
		{`{"tokens": [{"name": "a", "sha256": "abc", "role": "admin"}]}`, "tokens[0].sha256: must be the 64 hex digits"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "root"}]}`, `tokens[0].role: "root" is not a role`},
		{`{"tokens": [{"sha256": "` + h + `", "role": "admin"}]}`, "tokens[0].name: required"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "scheduler"}]}`, "tokens[0].topics: a scheduler needs"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "admin", "topics": ["x"]}]}`, "an admin has no topics"},
		{`{"require_id_prefixes": true, "tokens": [{"name": "a", "sha256": "` + h + `", "role": "scheduler", "topics": ["*"]}]}`, "tokens[0].id_prefixes: required"},
		{`{"require_id_prefixes": true, "tokens": [{"name": "a", "sha256": "` + h + `", "role": "scheduler", "topics": ["*"], "id_prefixes": ["a-"]},
		   {"name": "b", "sha256": "` + hash("u") + `", "role": "scheduler", "topics": ["*"], "id_prefixes": ["b-", "a-1"]}]}`, `tokens[1].id_prefixes[1]: "a-1" overlaps tokens[0].id_prefixes[0] "a-"`},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "scheduler", "topics": ["[x"]}]}`, "tokens[0].topics[0]"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "admin"}, {"name": "a", "sha256": "` + hash("u") + `", "role": "admin"}]}`, "tokens[1].name"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "admin"}, {"name": "b", "sha256": "` + h + `", "role": "admin"}]}`, "listed twice"},
		{`{"certificates": [{"name": "a", "role": "admin"}]}`, "certificates[0].common_name: required"},
		{`{"tokens": [], "users": []}`, "unknown field"},
		{`{} {}`, "more than one JSON value"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "scheduler", "topics": ["*"], "max_pending": 5}]}`, "max_pending: needs id_prefixes"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "admin", "burst": 5}]}`, "burst: a burst bounds nothing"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "scheduler", "topics": ["*"], "max_schedules": 5}]}`, "max_schedules: needs id_prefixes"},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "scheduler", "topics": ["*"], "min_interval": "100ms"}]}`, `tokens[0].min_interval: "100ms"; must be a duration of at least 1s`},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "scheduler", "topics": ["*"], "min_interval": "hourly"}]}`, `tokens[0].min_interval: "hourly"`},
		{`{"tokens": [{"name": "a", "sha256": "` + h + `", "role": "admin", "rate_per_second": -1}]}`, "rate_per_second"},
	} {
		_, err := Parse([]byte(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v, want %q", tc.file, err, tc.want)
		}
	}
}

func TestAdminHTTP(t *testing.T) {
	f := newFixture(t)
	h := f.a.AdminHTTP(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("profile")) }))
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"dash-token", http.StatusForbidden}, {"ops-token", http.StatusOK}} {
		r := httptest.NewRequest(http.MethodGet, "/debug/pprof/", nil)
		if tc.token != "" {
			r.Header.Set("Authorization", "Bearer "+tc.token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("token %q: %d %s, want %d", tc.token, w.Code, w.Body, tc.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(fmt.Sprintf(testFile, hash("a"), hash("b"), hash("c"), hash("d"), hash("e"))))
	f.Add([]byte(`{"tokens": [{"name": "a", "sha256": "00", "role": "admin"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := Parse(b)
		if err != nil {
			return
		}
		for _, g := range tab.tokens {
			if g.Name == "" || (g.Role == RoleScheduler && len(g.Topics) == 0) {
				t.Fatalf("accepted a grant that breaks the rules: %+v", g)
			}
		}
	})
}

func TestRateAndPendingQuota(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth.json")
	writeFile(t, path, fmt.Sprintf(`{"tokens": [
  {"name": "paced", "sha256": "%s", "role": "scheduler", "topics": ["*"], "rate_per_second": 10, "burst": 5},
  {"name": "quota", "sha256": "%s", "role": "scheduler", "topics": ["*"], "id_prefixes": ["q-"], "max_pending": 10}]}`,
		hash("paced-token"), hash("quota-token")))
	now := time.Unix(1e9, 0)
	counted := uint64(8)
	counts := 0
	a, err := New(Options{Path: path, Now: func() time.Time { return now }, Audit: &bytes.Buffer{},
		CountPending: func(_ context.Context, prefix string) (uint64, error) {
			if prefix != "q-" {
				t.Errorf("counted prefix %q", prefix)
			}
			counts++
			return counted, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{a: a}
	batch := func(token string, n int) error {
		evs := make([]*chimev1.Event, n)
		for i := range evs {
			evs[i] = &chimev1.Event{Topic: "t", Id: fmt.Sprintf("q-%d", i)}
		}
		return f.call(callCtx(token, certs.Identity{}), chimev1.Scheduler_BatchSchedule_FullMethodName, &chimev1.BatchScheduleRequest{Events: evs})
	}
	retryDelay := func(err error) time.Duration {
		for _, d := range status.Convert(err).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				return ri.GetRetryDelay().AsDuration()
			}
		}
		return -1
	}

	if err := batch("paced-token", 5); err != nil {
		t.Fatalf("a burst's worth: %v", err)
	}
	err = batch("paced-token", 1)
	if status.Code(err) != codes.ResourceExhausted || retryDelay(err) != 100*time.Millisecond {
		t.Fatalf("over the rate: %v (retry in %v), want RESOURCE_EXHAUSTED, retry in 100ms", err, retryDelay(err))
	}
	// The console, acting for the credential with a node's certificate, is
	// held to its rate too.
	consoleCall := metadata.NewIncomingContext(callCtx("", certs.Identity{Node: true, Name: "n1"}), metadata.Pairs(chimev1.ActingForMetadata, "paced"))
	if err := f.call(consoleCall, chimev1.Scheduler_Schedule_FullMethodName, &chimev1.ScheduleRequest{Event: &chimev1.Event{Topic: "t", Id: "c-1"}}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the console over paced's rate: %v, want RESOURCE_EXHAUSTED", err)
	}
	now = now.Add(100 * time.Millisecond)
	if err := batch("paced-token", 1); err != nil {
		t.Fatalf("after the retry delay: %v", err)
	}
	if err := batch("paced-token", 6); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "more than \"paced\"'s burst of 5") {
		t.Fatalf("a batch over the burst: %v", err)
	}

	if err := batch("quota-token", 2); err != nil {
		t.Fatalf("8 pending + 2 of 10: %v", err)
	}
	err = batch("quota-token", 1)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "has 10 pending events and may have at most 10") || retryDelay(err) != time.Second {
		t.Fatalf("over the quota: %v", err)
	}
	if counts != 1 {
		t.Fatalf("counted %d times within a second, want once", counts)
	}
	now, counted = now.Add(time.Second), 3
	if err := batch("quota-token", 7); err != nil {
		t.Fatalf("3 pending + 7 of 10 after a recount: %v", err)
	}
	if err := f.call(callCtx("quota-token", certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "q-1"}); err != nil {
		t.Fatalf("a Get is not held to the quota: %v", err)
	}
}

// TestRecurringQuotas: a scheduler's recurring schedules are held to its
// max_schedules, counted over its prefixes, and each Create takes one of
// its max_pending for the occurrence it makes pending; min_interval travels
// with the call (the rpc layer checks the rule against it), defaulting to
// a second.
func TestRecurringQuotas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	writeFile(t, path, fmt.Sprintf(`{"tokens": [
  {"name": "crons", "sha256": "%s", "role": "scheduler", "topics": ["*"], "id_prefixes": ["c-"],
   "max_schedules": 3, "max_pending": 5, "min_interval": "1m"},
  {"name": "plain", "sha256": "%s", "role": "scheduler", "topics": ["*"]}]}`, hash("crons-token"), hash("plain-token")))
	schedules, pending := uint64(2), uint64(3)
	a, err := New(Options{Path: path, Now: func() time.Time { return time.Unix(1e9, 0) },
		CountSchedules: func(_ context.Context, prefix string, limit uint64) (uint64, error) {
			if prefix != "c-" || limit != 3 {
				t.Errorf("CountSchedules(%q, %d)", prefix, limit)
			}
			return schedules, nil
		},
		CountPending: func(context.Context, string) (uint64, error) { return pending, nil }})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{a: a}
	create := func(token string) (*Grant, error) {
		return f.scopedCall(callCtx(token, certs.Identity{}), chimev1.Recurring_Create_FullMethodName,
			&chimev1.CreateRecurringRequest{Id: "c-1", Target: &chimev1.RecurringTarget{Topic: "t"}})
	}
	scope, err := create("crons-token")
	if err != nil || scope == nil || scope.ShortestInterval() != time.Minute {
		t.Fatalf("2 of 3 schedules: scope %v, %v; want through, with a min_interval of 1m", scope, err)
	}
	schedules = 3
	if _, err := create("crons-token"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), `"crons" has 3 recurring schedules and may have at most 3 (max_schedules)`) {
		t.Fatalf("at max_schedules: %v", err)
	}
	schedules = 0
	if _, err := create("crons-token"); err != nil { // 3 pending + 1 + this one: 5 of 5
		t.Fatalf("4 pending of 5: %v", err)
	}
	if _, err := create("crons-token"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "(max_pending)") {
		t.Fatalf("a schedule's occurrence over max_pending: %v", err)
	}
	if scope, err := create("plain-token"); err != nil || scope != nil {
		t.Fatalf("a grant of every topic and id, and the default min_interval: scope %v, %v", scope, err)
	}
	if g := a.table().byName["plain"]; g.ShortestInterval() != DefaultMinInterval {
		t.Fatalf("default min_interval %v", g.ShortestInterval())
	}
}

// TestTapRefusesBeforeTheBody: the tap handle, which runs on a call's
// headers before its body is read, refuses a caller without credentials
// or outside its role and audits it, and hands the caller it identified
// on to the interceptor, which then does not identify it again.
func TestTapRefusesBeforeTheBody(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		method string
		code   codes.Code
	}{
		{"no credentials", callCtx("", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, codes.Unauthenticated},
		{"unknown token", callCtx("guess", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, codes.Unauthenticated},
		{"a reader scheduling", callCtx("dash-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, codes.PermissionDenied},
		{"a scheduler", callCtx("billing-token", certs.Identity{}), chimev1.Scheduler_Schedule_FullMethodName, codes.OK},
	} {
		f.audit.Reset()
		ctx, err := f.a.Tap(tc.ctx, &tap.Info{FullMethodName: tc.method})
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
		if audited := f.audit.Len() > 0; audited != (err != nil) {
			t.Errorf("%s: audited %v with error %v", tc.name, audited, err)
		}
		if err != nil {
			continue
		}
		// The token is gone from the context the interceptor gets: it
		// still knows the caller.
		ctx = metadata.NewIncomingContext(ctx, metadata.MD{})
		scope, err := f.scopedCall(ctx, tc.method, &chimev1.ScheduleRequest{Event: &chimev1.Event{Topic: "billing.a", Id: "inv-9"}})
		if err != nil || scope == nil || scope.Name != "billing" {
			t.Errorf("%s: after the tap, the interceptor saw scope %v, %v", tc.name, scope, err)
		}
	}
}

// TestNodeCertificateMustNameAMember: Options.Node is asked about the node id
// a node certificate names on every call, and a refusal is PERMISSION_DENIED
// with its reason; a member's certificate calls as a node.
func TestNodeCertificateMustNameAMember(t *testing.T) {
	f := newFixture(t)
	var asked []string
	f.a.o.Node = func(id string) error {
		asked = append(asked, id)
		if id != "n2" {
			return fmt.Errorf("node %q is not a member of the cluster", id)
		}
		return nil
	}
	method := chimev1.Admin_NodeStatus_FullMethodName
	if err := f.call(callCtx("", certs.Identity{Node: true, NodeID: "n2", Name: "n2"}), method, &chimev1.NodeStatusRequest{}); err != nil {
		t.Fatalf("a member's node certificate was refused: %v", err)
	}
	for _, id := range []certs.Identity{{Node: true, NodeID: "n9", Name: "n9"}, {Node: true, Name: "old-style"}} {
		err := f.call(callCtx("", id), method, &chimev1.NodeStatusRequest{})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), fmt.Sprintf(`node %q is not a member`, id.NodeID)) {
			t.Errorf("%+v: %v; want PERMISSION_DENIED naming the reason", id, err)
		}
	}
	if !slices.Equal(asked, []string{"n2", "n9", ""}) {
		t.Errorf("Node was asked about %q, want n2, n9 and the certificate naming none", asked)
	}
}

// TestIngestActsForTheTopicsCredential: an ingest topic's calls are held to
// the credential the auth file names for the topic, as that credential's
// own calls are, and follow the file when it is reloaded.
func TestIngestActsForTheTopicsCredential(t *testing.T) {
	f := newFixture(t)
	if _, err := f.a.Ingest("chime.schedule"); err == nil || !strings.Contains(err.Error(), `names no credential for ingest topic "chime.schedule"`) {
		t.Fatalf("Ingest of a topic the file does not name: %v", err)
	}
	withIngest := strings.Replace(testFile, `"certificates": [`, `"ingest": {"chime.schedule": "billing"},
  "certificates": [`, 1)
	writeFile(t, f.path, fmt.Sprintf(withIngest, hash("ops-token"), hash("billing-token"), hash("any-token"), hash("dash-token"), hash("bdash-token")))
	f.now = f.now.Add(time.Hour) // past the reload interval
	icpt, err := f.a.Ingest("chime.schedule")
	if err != nil {
		t.Fatal(err)
	}
	call := func(method string, req any) (*Grant, error) {
		var scope *Grant
		_, err := icpt(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, _ any) (any, error) {
			scope = Scope(ctx)
			return "ok", nil
		})
		return scope, err
	}
	scope, err := call(chimev1.Scheduler_BatchSchedule_FullMethodName, &chimev1.BatchScheduleRequest{Events: []*chimev1.Event{{Id: "inv-1", Topic: "billing.due"}}})
	if err != nil || scope == nil || scope.Name != "billing" {
		t.Fatalf("a schedule within billing's topics and ids: scope %v, %v; want billing's scope", scope, err)
	}
	if _, err := call(chimev1.Scheduler_BatchSchedule_FullMethodName, &chimev1.BatchScheduleRequest{Events: []*chimev1.Event{{Id: "inv-2", Topic: "reminders"}}}); status.Code(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), `"reminders" is outside "billing"'s topics`) {
		t.Errorf("a schedule outside billing's topics: %v, want PERMISSION_DENIED naming the topic", err)
	}
	if _, err := call(chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: "other-1"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a cancel outside billing's id prefixes: %v, want PERMISSION_DENIED", err)
	}
	if _, err := call(chimev1.Admin_Drain_FullMethodName, &chimev1.DrainRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("an Admin call: %v, want PERMISSION_DENIED (billing is a scheduler)", err)
	}

	for _, tc := range []struct{ ingest, want string }{
		{`{"chime.schedule": "nobody"}`, `ingest["chime.schedule"]: "nobody" names no credential of the file`},
		{`{"chime.schedule": "dash"}`, `ingest["chime.schedule"]: "dash" is a reader`},
	} {
		file := fmt.Sprintf(strings.Replace(testFile, `"certificates": [`, `"ingest": `+tc.ingest+`,
  "certificates": [`, 1), hash("ops-token"), hash("billing-token"), hash("any-token"), hash("dash-token"), hash("bdash-token"))
		if _, err := Parse([]byte(file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ingest %s: %v, want %q", tc.ingest, err, tc.want)
		}
	}
}

// TestANodeActsForAConsoleUser: a node's call naming a credential it acts
// for (the console) is that credential's: its role and limits apply, its
// changes are audited under its name, its reads are not; a client cannot
// claim it; a credential the file no longer lists is refused.
func TestANodeActsForAConsoleUser(t *testing.T) {
	f := newFixture(t)
	node := certs.Identity{Node: true, Name: "n1", NodeID: "n1"}
	acting := func(cred string) context.Context {
		return metadata.NewIncomingContext(callCtx("", node), metadata.Pairs(chimev1.ActingForMetadata, cred))
	}
	sched := func(id, topic string) *chimev1.ScheduleRequest {
		return &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: id, Topic: topic}}
	}
	f.callWant(t, acting("billing"), chimev1.Scheduler_Schedule_FullMethodName, sched("inv-1", "billing.a"), codes.OK)
	f.callWant(t, acting("billing"), chimev1.Scheduler_Schedule_FullMethodName, sched("order-1", "billing.a"), codes.PermissionDenied)
	f.callWant(t, acting("dash"), chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: "inv-1"}, codes.PermissionDenied)
	f.callWant(t, acting("dash"), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "inv-1"}, codes.OK)
	f.callWant(t, acting("billing"), chimev1.Admin_Drain_FullMethodName, &chimev1.DrainRequest{}, codes.PermissionDenied)
	f.callWant(t, acting("nobody"), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"}, codes.Unauthenticated)
	// Trigger and Backfill are checked by id as Pause is, for a console
	// user as for a client.
	f.callWant(t, acting("billing"), chimev1.Recurring_Trigger_FullMethodName, &chimev1.TriggerRecurringRequest{Id: "inv-daily"}, codes.OK)
	f.callWant(t, acting("billing"), chimev1.Recurring_Trigger_FullMethodName, &chimev1.TriggerRecurringRequest{Id: "payroll-daily"}, codes.PermissionDenied)
	f.callWant(t, callCtx("billing-token", certs.Identity{}), chimev1.Recurring_Backfill_FullMethodName, &chimev1.BackfillRecurringRequest{Id: "payroll-daily"}, codes.PermissionDenied)
	// A client's claim to act for someone is not taken: it is itself.
	claim := metadata.NewIncomingContext(callCtx("", certs.Identity{}), metadata.Pairs("authorization", "Bearer dash-token", chimev1.ActingForMetadata, "ops"))
	f.callWant(t, claim, chimev1.Admin_Drain_FullMethodName, &chimev1.DrainRequest{}, codes.PermissionDenied)
	if scope, err := f.scopedCall(acting("billing"), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "inv-1"}); err != nil || scope == nil || scope.Name != "billing" {
		t.Errorf("acting for billing: scope %v, %v", scope, err)
	}

	audit := f.audit.String()
	for _, want := range []string{
		`"who":"billing (console on n1)","peer":"10.0.0.9:5","method":"/chime.v1.Scheduler/Schedule","result":"OK"`,
		`"who":"dash (console on n1)"`, // the refused cancel
	} {
		if !strings.Contains(audit, want) {
			t.Errorf("audit log lacks %s:\n%s", want, audit)
		}
	}
	if strings.Contains(audit, "Scheduler/Get\",\"result\":\"OK\"") {
		t.Errorf("a console read was audited:\n%s", audit)
	}
}

// TestSignIn: a token or a listed client certificate names the console
// session's credential; a wrong token, an unlisted certificate and a
// node's certificate sign no one in; each attempt is audited.
func TestSignIn(t *testing.T) {
	f := newFixture(t)
	f.a.o.Identify = func(chain []*x509.Certificate) (certs.Identity, error) {
		if chain[0].Subject.CommonName == "n1" {
			return certs.Identity{Node: true, Name: "n1", NodeID: "n1"}, nil
		}
		return certs.Identity{Cert: true, Name: chain[0].Subject.CommonName}, nil
	}
	req := func(cn string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/ui/login", nil)
		if cn != "" {
			r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: cn}}}}
		}
		return r
	}
	for _, tc := range []struct {
		name, token, cn, want, err string
	}{
		{"token", "billing-token", "", "billing", ""},
		{"token over a certificate", "dash-token", "app-1", "dash", ""},
		{"certificate", "", "app-1", "app", ""},
		{"wrong token", "guess", "", "", "not in the node's auth file"},
		{"unlisted certificate", "", "other", "", "has no role"},
		{"node certificate", "", "n1", "", "a node certificate signs no one in"},
		{"nothing", "", "", "", "no credentials"},
	} {
		g, err := f.a.SignIn(req(tc.cn), tc.token)
		switch {
		case tc.err == "" && (err != nil || g.Name != tc.want):
			t.Errorf("%s: %v, %v; want %s", tc.name, g, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, %v; want an error saying %q", tc.name, g, err, tc.err)
		}
	}
	f.a.Close() // writes the refusals held back
	if n := strings.Count(f.audit.String(), `"method":"console sign-in"`); n != 7 {
		t.Errorf("%d sign-in lines, want 7:\n%s", n, f.audit)
	}
}
