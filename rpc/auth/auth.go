package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/durationpb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/certs"
)

// Role is what a credential may do.
type Role string

// The roles; see doc.go.
const (
	RoleAdmin     Role = "admin"
	RoleScheduler Role = "scheduler"
	RoleReader    Role = "reader"
)

// Grant is one credential's role and limits.
type Grant struct {
	Name string
	Role Role
	// Topics are path.Match patterns of the topics whose events and
	// schedules the credential may see and change; a scheduler names at
	// least one, a reader none for every topic.
	Topics []string
	// IDPrefixes, when set, are the only ids it may see and change.
	IDPrefixes []string
	// Rate bounds the events scheduled plus the other calls made a second
	// (0: no bound), with bursts of up to Burst.
	Rate  float64
	Burst int
	// MaxPending bounds the pending events under the grant's id prefixes
	// (0: no bound); a scheduler with id prefixes only. A recurring
	// schedule's pending occurrence is one of them, so creating a schedule
	// takes one.
	MaxPending uint64
	// MaxSchedules bounds the recurring schedules under the grant's id
	// prefixes (0: no bound); a scheduler with id prefixes only.
	MaxSchedules uint64
	// MinInterval is the shortest time a recurring schedule of the grant's
	// may leave between two occurrences (DefaultMinInterval when the file
	// names none).
	MinInterval time.Duration
}

// DefaultMinInterval is a grant's MinInterval when its entry names none:
// the finest a rule can be anyway (cron's seconds, every's smallest).
const DefaultMinInterval = time.Second

// entry is one credential as the file spells it.
type entry struct {
	Name         string   `json:"name"`
	SHA256       string   `json:"sha256,omitempty"`
	CommonName   string   `json:"common_name,omitempty"`
	Role         Role     `json:"role"`
	Topics       []string `json:"topics,omitempty"`
	IDPrefixes   []string `json:"id_prefixes,omitempty"`
	Rate         float64  `json:"rate_per_second,omitempty"`
	Burst        int      `json:"burst,omitempty"`
	MaxPending   uint64   `json:"max_pending,omitempty"`
	MaxSchedules uint64   `json:"max_schedules,omitempty"`
	MinInterval  string   `json:"min_interval,omitempty"`
}

type file struct {
	// RequireIDPrefixes makes every scheduler carry id_prefixes that no
	// other scheduler's overlap: each tenant's ids are its own, so that no
	// id it asks about, or takes, can be another's.
	RequireIDPrefixes bool    `json:"require_id_prefixes,omitempty"`
	Tokens            []entry `json:"tokens"`
	Certificates      []entry `json:"certificates"`
	// Ingest names, by ingest topic, the credential the records of that
	// topic act for.
	Ingest map[string]string `json:"ingest,omitempty"`
}

// Table is a parsed auth file.
type Table struct {
	tokens map[[32]byte]*Grant
	certs  map[string]*Grant
	// byName finds the grant a forwarded call names (CredentialMetadata).
	byName map[string]*Grant
	// ingest is the grant each ingest topic's records act for.
	ingest map[string]*Grant
}

// Parse reads an auth file:
//
//	{"tokens": [{"name": "ops", "sha256": "<hex of the token's SHA-256>", "role": "admin"},
//	            {"name": "billing", "sha256": "...", "role": "scheduler",
//	             "topics": ["billing.*"], "id_prefixes": ["chime.schedule/inv-"]}],
//	 "certificates": [{"name": "dashboard", "common_name": "dash-1", "role": "reader"}],
//	 "ingest": {"chime.schedule": "billing"}}
//
// "ingest" names, by ingest topic, the credential (a scheduler or an admin)
// whose roles, topics, id prefixes, rate and quotas apply to the topic's
// records, as to that credential's own calls.
//
// With "require_id_prefixes": true, every scheduler must have id_prefixes,
// and no two schedulers' prefixes may overlap (one a prefix of the other).
// Readers may share a scheduler's prefixes: a tenant's dashboard reads the
// ids its scheduler writes. Errors name the field and the rule.
func Parse(b []byte) (*Table, error) {
	var f file
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("not an auth file: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not an auth file: more than one JSON value")
	}
	t := &Table{tokens: map[[32]byte]*Grant{}, certs: map[string]*Grant{}, byName: map[string]*Grant{}}
	names := map[string]string{}
	type owned struct{ prefix, at string }
	var prefixes []owned // the schedulers', with require_id_prefixes
	for _, list := range []struct {
		field   string
		entries []entry
	}{{"tokens", f.Tokens}, {"certificates", f.Certificates}} {
		for i, e := range list.entries {
			at := fmt.Sprintf("%s[%d]", list.field, i)
			g, err := e.grant(at)
			if err != nil {
				return nil, err
			}
			if prev, dup := names[e.Name]; dup {
				return nil, fmt.Errorf("%s.name: %q is also %s's name; names must be unique (the audit log tells callers by them)", at, e.Name, prev)
			}
			names[e.Name] = at
			t.byName[e.Name] = g
			if f.RequireIDPrefixes && g.Role == RoleScheduler {
				if len(g.IDPrefixes) == 0 {
					return nil, fmt.Errorf("%s.id_prefixes: required: require_id_prefixes is set, so every scheduler's ids are its own", at)
				}
				for j, p := range g.IDPrefixes {
					here := fmt.Sprintf("%s.id_prefixes[%d]", at, j)
					for _, o := range prefixes {
						if strings.HasPrefix(p, o.prefix) || strings.HasPrefix(o.prefix, p) {
							return nil, fmt.Errorf("%s: %q overlaps %s %q; with require_id_prefixes no two schedulers may share ids", here, p, o.at, o.prefix)
						}
					}
					prefixes = append(prefixes, owned{p, here})
				}
			}
			if list.field == "tokens" {
				if e.CommonName != "" {
					return nil, fmt.Errorf("%s.common_name: a token has none (certificates go under \"certificates\")", at)
				}
				h, err := hex.DecodeString(e.SHA256)
				if err != nil || len(h) != sha256.Size {
					return nil, fmt.Errorf("%s.sha256: must be the 64 hex digits of the token's SHA-256 (sha256sum), got %q", at, e.SHA256)
				}
				key := [32]byte(h)
				if _, dup := t.tokens[key]; dup {
					return nil, fmt.Errorf("%s.sha256: the same token is listed twice", at)
				}
				t.tokens[key] = g
			} else {
				if e.SHA256 != "" {
					return nil, fmt.Errorf("%s.sha256: a certificate has none (tokens go under \"tokens\")", at)
				}
				if e.CommonName == "" {
					return nil, fmt.Errorf("%s.common_name: required", at)
				}
				if _, dup := t.certs[e.CommonName]; dup {
					return nil, fmt.Errorf("%s.common_name: %q is listed twice", at, e.CommonName)
				}
				t.certs[e.CommonName] = g
			}
		}
	}
	for topic, name := range f.Ingest {
		g := t.byName[name]
		switch {
		case g == nil:
			return nil, fmt.Errorf("ingest[%q]: %q names no credential of the file", topic, name)
		case g.Role == RoleReader:
			return nil, fmt.Errorf("ingest[%q]: %q is a reader; an ingest topic's records schedule and cancel, which needs a scheduler or an admin", topic, name)
		}
		if t.ingest == nil {
			t.ingest = map[string]*Grant{}
		}
		t.ingest[topic] = g
	}
	return t, nil
}

func (e entry) grant(at string) (*Grant, error) {
	if e.Name == "" {
		return nil, fmt.Errorf("%s.name: required", at)
	}
	switch e.Role {
	case RoleAdmin:
		if len(e.Topics) > 0 || len(e.IDPrefixes) > 0 {
			return nil, fmt.Errorf("%s: an admin has no topics or id_prefixes (its calls are not limited by them)", at)
		}
	case RoleReader:
		// Without topics, a reader reads every topic.
	case RoleScheduler:
		if len(e.Topics) == 0 {
			return nil, fmt.Errorf("%s.topics: a scheduler needs at least one topic pattern (\"*\" for every topic)", at)
		}
	default:
		return nil, fmt.Errorf("%s.role: %q is not a role; one of admin, scheduler, reader", at, e.Role)
	}
	for j, p := range e.Topics {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return nil, fmt.Errorf("%s.topics[%d]: %q is not a pattern (path.Match syntax: * ? [a-z])", at, j, p)
		}
	}
	for j, p := range e.IDPrefixes {
		if p == "" {
			return nil, fmt.Errorf("%s.id_prefixes[%d]: empty (leave id_prefixes out to allow every id)", at, j)
		}
	}
	switch {
	case e.Rate < 0 || math.IsNaN(e.Rate) || math.IsInf(e.Rate, 0):
		return nil, fmt.Errorf("%s.rate_per_second: %v; must be a positive number (leave it out for no bound)", at, e.Rate)
	case e.Burst < 0:
		return nil, fmt.Errorf("%s.burst: %d; must be positive", at, e.Burst)
	case e.Burst > 0 && e.Rate == 0:
		return nil, fmt.Errorf("%s.burst: a burst bounds nothing without rate_per_second", at)
	case e.MaxPending > 0 && len(e.IDPrefixes) == 0:
		return nil, fmt.Errorf("%s.max_pending: needs id_prefixes: a node counts a credential's pending events by its id prefixes", at)
	case e.MaxSchedules > 0 && len(e.IDPrefixes) == 0:
		return nil, fmt.Errorf("%s.max_schedules: needs id_prefixes: a node counts a credential's recurring schedules by its id prefixes", at)
	}
	g := &Grant{Name: e.Name, Role: e.Role, Topics: e.Topics, IDPrefixes: e.IDPrefixes, Rate: e.Rate, Burst: e.Burst,
		MaxPending: e.MaxPending, MaxSchedules: e.MaxSchedules, MinInterval: DefaultMinInterval}
	if e.MinInterval != "" {
		d, err := time.ParseDuration(e.MinInterval)
		if err != nil || d < DefaultMinInterval {
			return nil, fmt.Errorf("%s.min_interval: %q; must be a duration of at least %v (\"1m\", \"90s\")", at, e.MinInterval, DefaultMinInterval)
		}
		g.MinInterval = d
	}
	if g.Rate > 0 && g.Burst == 0 {
		g.Burst = max(1, int(math.Ceil(g.Rate))) // a second's worth
	}
	return g, nil
}

// Permits reports whether the credential may see and change the event or
// schedule id whose topic is topic.
func (g *Grant) Permits(id, topic string) bool {
	return g.idAllowed(id) && (g.everyTopic() || g.topicAllowed(topic))
}

// Credential is the grant's name, which refusals and the audit log use.
func (g *Grant) Credential() string { return g.Name }

// ShortestInterval is the least time a recurring schedule of the grant's
// may leave between two occurrences (its min_interval).
func (g *Grant) ShortestInterval() time.Duration { return g.MinInterval }

// limited reports whether the grant limits what its holder sees: an admin,
// or a grant with every topic and every id, is not limited.
func (g *Grant) limited() bool {
	return g.Role != RoleAdmin && (len(g.IDPrefixes) > 0 || !g.everyTopic())
}

// refuse is the refusal of an operation on id: the same words whether or
// not the id exists, naming nothing but the id and the caller's credential.
func (g *Grant) refuse(id string) error {
	return status.Errorf(codes.PermissionDenied, "id %q: not permitted for credential %q", id, g.Name)
}

type scopeKey struct{}

// Scope returns the grant that limits the call whose context is ctx, or nil
// when nothing limits it (no auth file, an admin, a node acting for itself,
// a grant of every topic and id, and of the default min_interval). The operation is checked against it where
// it acts on the stored event: see shard.Scope.
func Scope(ctx context.Context) *Grant {
	g, _ := ctx.Value(scopeKey{}).(*Grant)
	return g
}

func withScope(ctx context.Context, c caller) context.Context {
	if c.grant == nil || (!c.grant.limited() && c.grant.MinInterval <= DefaultMinInterval) {
		return ctx
	}
	return context.WithValue(ctx, scopeKey{}, c.grant)
}

func (g *Grant) topicAllowed(topic string) bool {
	for _, p := range g.Topics {
		if ok, _ := path.Match(p, topic); ok {
			return true
		}
	}
	return false
}

func (g *Grant) everyTopic() bool {
	if len(g.Topics) == 0 {
		return g.Role != RoleScheduler // a reader without topics reads them all
	}
	for _, p := range g.Topics {
		if p == "*" {
			return true
		}
	}
	return false
}

func (g *Grant) idAllowed(id string) bool {
	if len(g.IDPrefixes) == 0 {
		return true
	}
	for _, p := range g.IDPrefixes {
		if strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}

// Options configure an Authorizer.
type Options struct {
	// Path is the auth file (--auth-file).
	Path   string
	Logger *slog.Logger
	// Audit receives the audit log, one JSON object per line; nil writes it
	// to Logger.
	Audit io.Writer
	// Identify classifies a client certificate on the HTTP port (the gRPC
	// port's connections carry it in certs.AuthInfo); nil without TLS.
	Identify func([]*x509.Certificate) (certs.Identity, error)
	// CountPending counts the pending events whose id starts with prefix,
	// for max_pending.
	CountPending func(ctx context.Context, prefix string) (uint64, error)
	// CountSchedules counts the recurring schedules whose id starts with
	// prefix, for max_schedules; it may stop counting past limit.
	CountSchedules func(ctx context.Context, prefix string, limit uint64) (uint64, error)
	// Node says why the node a node certificate names (certs.Identity.
	// NodeID, "" when it names none) may not call, if it may not: not a
	// member, or removed. Nil takes every node certificate.
	Node func(id string) error
	Now  func() time.Time
	// RefusalWindow is how often, at most, a caller refused again and
	// again from one address gets a line in the audit log after its first
	// (0: DefaultRefusalWindow).
	RefusalWindow time.Duration
}

// Authorizer checks every call against the auth file.
type Authorizer struct {
	o Options

	mu      sync.Mutex
	t       *Table
	stamp   stamp
	checked time.Time
	failed  stamp

	auditMu  sync.Mutex
	refusals *refusalLog

	// Per grant name: its rate limiter and its pending count, each made
	// again when the grant's bounds change in the file.
	limitsMu sync.Mutex
	limiters map[string]*limiter
	pending  map[string]*pendingCount
}

type limiter struct {
	rate  float64
	burst int
	l     *rate.Limiter
}

// pendingCount is a grant's pending events as last counted: a quota is
// checked against a count at most pendingCountAge old (counting every
// call would cost a cluster-wide Count each), plus what was admitted since.
type pendingCount struct {
	mu       sync.Mutex
	n        uint64
	at       time.Time
	admitted uint64
}

const pendingCountAge = time.Second

type stamp struct {
	size int64
	mod  time.Time
}

const reloadEvery = time.Second

// New reads the auth file.
func New(o Options) (*Authorizer, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RefusalWindow == 0 {
		o.RefusalWindow = DefaultRefusalWindow
	}
	a := &Authorizer{o: o, limiters: map[string]*limiter{}, pending: map[string]*pendingCount{}}
	a.refusals = newRefusalLog(o.RefusalWindow, a.write)
	st, t, err := a.read()
	if err != nil {
		return nil, err
	}
	a.t, a.stamp, a.checked = t, st, o.Now()
	return a, nil
}

func (a *Authorizer) read() (stamp, *Table, error) {
	fi, err := os.Stat(a.o.Path)
	if err != nil {
		return stamp{}, nil, fmt.Errorf("--auth-file: %w", err)
	}
	st := stamp{size: fi.Size(), mod: fi.ModTime()}
	b, err := os.ReadFile(a.o.Path)
	if err != nil {
		return st, nil, fmt.Errorf("--auth-file: %w", err)
	}
	t, err := Parse(b)
	if err != nil {
		return st, nil, fmt.Errorf("--auth-file %s: %w", a.o.Path, err)
	}
	return st, t, nil
}

// table returns the table in force, reading the file again if it changed.
func (a *Authorizer) table() *Table {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.o.Now()
	if now.Sub(a.checked) < reloadEvery {
		return a.t
	}
	a.checked = now
	fi, err := os.Stat(a.o.Path)
	if err == nil && (stamp{size: fi.Size(), mod: fi.ModTime()}) == a.stamp {
		return a.t
	}
	st, t, err := a.read()
	if err == nil {
		a.t, a.stamp, a.failed = t, st, stamp{}
		a.o.Logger.Info("auth file reloaded", "file", a.o.Path, "tokens", len(t.tokens), "certificates", len(t.certs))
		return a.t
	}
	if st != a.failed {
		a.failed = st
		a.o.Logger.Error("the auth file changed but does not load; keeping the one in force", "err", err)
	}
	return a.t
}

// caller is who is calling: a node, or a grant. A node that forwards
// another's call carries that call's grant too.
type caller struct {
	node      bool
	forwarded bool // a node forwarding a client's call
	actingFor bool // a node calling for grant's credential (the console)
	grant     *Grant
	name      string // for the audit log
}

func (a *Authorizer) lookupToken(tok string) *Grant {
	// Looked up by the token's hash: how long a lookup takes tells a caller
	// about the hash of its guess, which says nothing about any token.
	return a.table().tokens[sha256.Sum256([]byte(tok))]
}

// identify finds the caller from a token or a certificate identity.
func (a *Authorizer) identify(tok string, hasTok bool, id certs.Identity) (caller, error) {
	if id.Node {
		c := caller{node: true, name: "node " + id.Name}
		if id.NodeID != "" {
			c.name = "node " + id.NodeID
		}
		if a.o.Node != nil {
			if err := a.o.Node(id.NodeID); err != nil {
				return c, status.Errorf(codes.PermissionDenied, "node certificate %q: %v", id.Name, err)
			}
		}
		return c, nil
	}
	if hasTok {
		if g := a.lookupToken(tok); g != nil {
			return caller{grant: g, name: g.Name}, nil
		}
		return caller{name: "unknown token"}, status.Error(codes.Unauthenticated, "the bearer token is not in the node's auth file (revoked, mistyped, or for another cluster)")
	}
	if id.Cert {
		if g := a.table().certs[id.Name]; g != nil {
			return caller{grant: g, name: g.Name}, nil
		}
		return caller{name: "certificate " + id.Name}, status.Errorf(codes.Unauthenticated, "client certificate %q has no role in the node's auth file", id.Name)
	}
	return caller{name: "anonymous"}, status.Error(codes.Unauthenticated, "no credentials: send \"authorization: Bearer <token>\" (chimectl --token or CHIME_TOKEN) or a client certificate listed in the node's auth file")
}

func bearer(md metadata.MD) (tok string, ok bool, err error) {
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", false, nil
	}
	v := vals[0]
	if len(v) < 7 || !strings.EqualFold(v[:7], "bearer ") {
		return "", false, status.Error(codes.Unauthenticated, "authorization metadata must be \"Bearer <token>\"")
	}
	return strings.TrimSpace(v[7:]), true, nil
}

func (a *Authorizer) callerOf(ctx context.Context) (caller, error) {
	var id certs.Identity
	if p, ok := peer.FromContext(ctx); ok {
		if ai, ok := p.AuthInfo.(certs.AuthInfo); ok {
			id = ai.Identity
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	tok, has, err := bearer(md)
	if err != nil {
		return caller{name: "malformed authorization"}, err
	}
	c, err := a.identify(tok, has, id)
	if err != nil || !c.node {
		return c, err
	}
	// Only a node's word is taken for whose call it forwards, or whom it
	// acts for.
	c.forwarded = len(md.Get(chimev1.ForwardedMetadata)) > 0
	if names := md.Get(chimev1.CredentialMetadata); c.forwarded && len(names) > 0 {
		g := a.table().byName[names[0]]
		if g == nil {
			return c, status.Errorf(codes.Unauthenticated, "%s forwarded a call of credential %q, which this node's auth file does not list (the nodes' auth files differ)", c.name, names[0])
		}
		c.grant, c.name = g, g.Name+" (forwarded by "+c.name+")"
	} else if names := md.Get(chimev1.ActingForMetadata); !c.forwarded && len(names) > 0 {
		g := a.table().byName[names[0]]
		if g == nil {
			return c, status.Errorf(codes.Unauthenticated, "%s called for credential %q, which this node's auth file does not list (revoked since it signed in, or the nodes' auth files differ)", c.name, names[0])
		}
		c.grant, c.actingFor, c.name = g, true, g.Name+" (console on "+strings.TrimPrefix(c.name, "node ")+")"
	}
	return c, nil
}

// Service method kinds.
const (
	schedulerPrefix  = "/chime.v1.Scheduler/"
	recurringPrefix  = "/chime.v1.Recurring/"
	adminPrefix      = "/chime.v1.Admin/"
	peerPrefix       = "/chime.v1.Peer/"
	reflectionPrefix = "/grpc.reflection."
)

var readMethods = map[string]bool{
	chimev1.Scheduler_Get_FullMethodName: true, chimev1.Scheduler_List_FullMethodName: true, chimev1.Scheduler_Count_FullMethodName: true,
	chimev1.Scheduler_Forecast_FullMethodName: true, chimev1.Recurring_Get_FullMethodName: true, chimev1.Recurring_List_FullMethodName: true,
}

// authorize checks that c may call method; req is the request, or nil for a
// stream whose request is checked by check on arrival.
func (a *Authorizer) authorize(c caller, method string) error {
	// A node may call anything; a grant it forwards for only limits what
	// the forwarded call may act on. A Peer call carries a client's request
	// the node that received it authorized against that grant already.
	if c.node && (c.grant == nil || strings.HasPrefix(method, peerPrefix)) {
		return nil
	}
	g := c.grant
	switch {
	case strings.HasPrefix(method, reflectionPrefix):
		return nil
	case strings.HasPrefix(method, peerPrefix):
		return status.Errorf(codes.PermissionDenied, "%s: the Peer service is for nodes of the cluster (a node certificate), not %s %q", method, g.Role, g.Name)
	case g.Role == RoleAdmin:
		return nil
	case method == chimev1.Admin_GetClusterMap_FullMethodName:
		// Which node leads which shard: what a client needs to send each
		// call straight to its leader.
		return nil
	case strings.HasPrefix(method, adminPrefix):
		return status.Errorf(codes.PermissionDenied, "%s needs the admin role; %q is a %s", method, g.Name, g.Role)
	case readMethods[method]:
		return nil
	case strings.HasPrefix(method, schedulerPrefix) && g.Role == RoleScheduler:
		return nil
	case strings.HasPrefix(method, schedulerPrefix):
		return status.Errorf(codes.PermissionDenied, "%s needs the scheduler or admin role; %q is a %s (Get, List and Count only)", method, g.Name, g.Role)
	case strings.HasPrefix(method, recurringPrefix) && g.Role == RoleScheduler:
		return nil
	case strings.HasPrefix(method, recurringPrefix):
		return status.Errorf(codes.PermissionDenied, "%s needs the scheduler or admin role; %q is a %s (Get and List only)", method, g.Name, g.Role)
	}
	return status.Errorf(codes.PermissionDenied, "%s: only an admin may call it", method)
}

// check checks a request against the caller's topics and id prefixes, as
// far as the request itself tells: the id it names, the topic of what it
// creates, the filter of a query. Whether the event or schedule an id names
// is the caller's is decided where the operation reads it (shard.Scope), so
// a refusal of an id reads the same whether or not the id exists.
func (a *Authorizer) check(c caller, req any) error {
	g := c.grant
	if g == nil || !g.limited() {
		return nil
	}
	every := g.everyTopic()
	event := func(at string, e *chimev1.Event) error {
		if !every && !g.topicAllowed(e.GetTopic()) {
			return status.Errorf(codes.PermissionDenied, "%s.topic: %q is outside %q's topics %v", at, e.GetTopic(), g.Name, g.Topics)
		}
		switch {
		case e.GetId() == "" && len(g.IDPrefixes) > 0:
			return status.Errorf(codes.PermissionDenied, "%s.id: required for %q, whose ids must start with one of %v (a generated one would not)", at, g.Name, g.IDPrefixes)
		case !g.idAllowed(e.GetId()):
			return g.refuse(e.GetId())
		}
		return nil
	}
	byID := func(id string) error {
		if !g.idAllowed(id) {
			return g.refuse(id)
		}
		return nil
	}
	filter := func(f *chimev1.EventFilter) error {
		if !every && !g.topicAllowed(f.GetTopic()) {
			return status.Errorf(codes.PermissionDenied, "filter.topic: %q's queries must name one of its topics %v, got %q", g.Name, g.Topics, f.GetTopic())
		}
		if len(g.IDPrefixes) > 0 && !g.idAllowed(f.GetIdPrefix()) {
			return status.Errorf(codes.PermissionDenied, "filter.id_prefix: %q's queries must stay within its id prefixes %v, got %q", g.Name, g.IDPrefixes, f.GetIdPrefix())
		}
		return nil
	}
	// A recurring schedule is checked as the events it makes would be: its
	// target's topic and its id (an occurrence's id starts with it).
	target := func(t *chimev1.RecurringTarget) error {
		if !every && !g.topicAllowed(t.GetTopic()) {
			return status.Errorf(codes.PermissionDenied, "target.topic: %q is outside %q's topics %v", t.GetTopic(), g.Name, g.Topics)
		}
		return nil
	}
	switch r := req.(type) {
	case *chimev1.CreateRecurringRequest:
		if err := target(r.GetTarget()); err != nil {
			return err
		}
		return byID(r.GetId())
	case *chimev1.UpdateRecurringRequest:
		if r.GetTarget() != nil {
			if err := target(r.GetTarget()); err != nil {
				return err
			}
		}
		return byID(r.GetId())
	case *chimev1.DeleteRecurringRequest:
		return byID(r.GetId())
	case *chimev1.PauseRecurringRequest:
		return byID(r.GetId())
	case *chimev1.ResumeRecurringRequest:
		return byID(r.GetId())
	case *chimev1.TriggerRecurringRequest:
		return byID(r.GetId())
	case *chimev1.BackfillRecurringRequest:
		return byID(r.GetId())
	case *chimev1.GetRecurringRequest:
		return byID(r.GetId())
	case *chimev1.ListRecurringRequest:
		if len(g.IDPrefixes) > 0 && !g.idAllowed(r.GetIdPrefix()) {
			return status.Errorf(codes.PermissionDenied, "id_prefix: %q's queries must stay within its id prefixes %v, got %q", g.Name, g.IDPrefixes, r.GetIdPrefix())
		}
	case *chimev1.ScheduleRequest:
		return event("event", r.GetEvent())
	case *chimev1.BatchScheduleRequest:
		for i, e := range r.GetEvents() {
			if err := event(fmt.Sprintf("events[%d]", i), e); err != nil {
				return err
			}
		}
	case *chimev1.UpdateRequest:
		return byID(r.GetId())
	case *chimev1.CancelRequest:
		return byID(r.GetId())
	case *chimev1.GetRequest:
		return byID(r.GetId())
	case *chimev1.ListRequest:
		return filter(r.GetFilter())
	case *chimev1.CountRequest:
		return filter(r.GetFilter())
	case *chimev1.CancelMatchingRequest:
		return filter(r.GetFilter())
	}
	return nil
}

// cost is what a call counts against its caller's rate: the events of a
// schedule, 1 for any other call.
func cost(req any) int {
	if r, ok := req.(*chimev1.BatchScheduleRequest); ok {
		return max(1, len(r.GetEvents()))
	}
	return 1
}

// limit applies the caller's rate and pending-event quota to req.
func (a *Authorizer) limit(ctx context.Context, c caller, req any) error {
	// A forwarded call was limited where it arrived; a call a node makes
	// for a console user arrives here, and is that user's.
	if c.node && !c.actingFor {
		return nil
	}
	g := c.grant
	if g.Rate > 0 {
		if err := a.takeRate(g, cost(req)); err != nil {
			return err
		}
	}
	_, creates := req.(*chimev1.CreateRecurringRequest)
	if creates && g.MaxSchedules > 0 && a.o.CountSchedules != nil {
		if err := a.checkSchedules(ctx, g); err != nil {
			return err
		}
	}
	if g.MaxPending > 0 && a.o.CountPending != nil {
		n := 0
		switch r := req.(type) {
		case *chimev1.ScheduleRequest:
			n = 1
		case *chimev1.BatchScheduleRequest:
			n = len(r.GetEvents())
		case *chimev1.CreateRecurringRequest:
			n = 1 // its pending occurrence
		case *chimev1.TriggerRecurringRequest:
			n = 1
		case *chimev1.BackfillRecurringRequest:
			// How many rule times fall in its range is known only where it
			// applies: counted as one. Each is due at once, so they pend only
			// until fired, and a backfill makes at most 1000.
			n = 1
		}
		if n > 0 {
			return a.takePending(ctx, g, uint64(n))
		}
	}
	return nil
}

// checkSchedules refuses a Create of g's when g has MaxSchedules already.
// The count is the cluster's at the call: two Creates at once may both
// pass it, so the bound can be passed by the calls in flight.
func (a *Authorizer) checkSchedules(ctx context.Context, g *Grant) error {
	var total uint64
	for _, p := range g.IDPrefixes {
		n, err := a.o.CountSchedules(ctx, p, g.MaxSchedules)
		if err != nil {
			return err
		}
		total += n
	}
	if total >= g.MaxSchedules {
		return status.Errorf(codes.ResourceExhausted, "%q has %d recurring schedules and may have at most %d (max_schedules): delete one first", g.Name, total, g.MaxSchedules)
	}
	return nil
}

func (a *Authorizer) takeRate(g *Grant, n int) error {
	a.limitsMu.Lock()
	l := a.limiters[g.Name]
	if l == nil || l.rate != g.Rate || l.burst != g.Burst {
		l = &limiter{rate: g.Rate, burst: g.Burst, l: rate.NewLimiter(rate.Limit(g.Rate), g.Burst)}
		a.limiters[g.Name] = l
	}
	a.limitsMu.Unlock()
	if n > l.burst {
		return status.Errorf(codes.ResourceExhausted, "a call of %d events is more than %q's burst of %d: send smaller batches, or raise its burst in the auth file", n, g.Name, l.burst)
	}
	now := a.o.Now()
	r := l.l.ReserveN(now, n)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return retryLater(d, "%q is over its rate of %g a second (bursts of %d); retry in %v", g.Name, g.Rate, g.Burst, d.Round(time.Millisecond))
	}
	return nil
}

func (a *Authorizer) takePending(ctx context.Context, g *Grant, n uint64) error {
	a.limitsMu.Lock()
	pc := a.pending[g.Name]
	if pc == nil {
		pc = &pendingCount{}
		a.pending[g.Name] = pc
	}
	a.limitsMu.Unlock()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	now := a.o.Now()
	if pc.at.IsZero() || now.Sub(pc.at) >= pendingCountAge {
		var total uint64
		for _, p := range g.IDPrefixes {
			m, err := a.o.CountPending(ctx, p)
			if err != nil {
				return err
			}
			total += m
		}
		pc.n, pc.at, pc.admitted = total, now, 0
	}
	if have := pc.n + pc.admitted; have+n > g.MaxPending {
		return retryLater(pendingCountAge, "%q has %d pending events and may have at most %d (max_pending): %d more would exceed it; retry once some have fired or been cancelled",
			g.Name, have, g.MaxPending, n)
	}
	pc.admitted += n
	return nil
}

// retryLater is RESOURCE_EXHAUSTED with the delay after which a retry may
// succeed, as a RetryInfo detail (which gRPC clients and grpcurl show).
func retryLater(d time.Duration, format string, args ...any) error {
	st := status.Newf(codes.ResourceExhausted, format, args...)
	if ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); err == nil {
		st = ds
	}
	return st.Err()
}

type callerKey struct{}

// Tap identifies the caller of a call from its headers and its connection,
// and refuses one without a valid credential or outside its role before
// gRPC reads the request's body: an unauthenticated caller costs a node the
// headers of its calls, not the (up to MaxRecvMsgSize) bodies. It is
// grpc.InTapHandle's handle, run on the connection's reader goroutine, so
// it only looks things up in memory. The interceptors find the caller it
// identified in the call's context.
func (a *Authorizer) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	c, err := a.callerOf(ctx)
	if err == nil {
		err = a.authorize(c, info.FullMethodName)
	}
	if err != nil {
		a.audit(ctx, c, info.FullMethodName, err)
		return ctx, err
	}
	return context.WithValue(ctx, callerKey{}, c), nil
}

// caller returns the caller Tap identified, or identifies and authorizes
// it now (a server without the tap handle).
func (a *Authorizer) caller(ctx context.Context, method string) (caller, error) {
	if c, ok := ctx.Value(callerKey{}).(caller); ok {
		return c, nil
	}
	c, err := a.callerOf(ctx)
	if err == nil {
		err = a.authorize(c, method)
	}
	return c, err
}

// UnaryInterceptor authorizes every unary call.
func (a *Authorizer) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c, err := a.caller(ctx, info.FullMethod)
	if err == nil {
		err = a.check(c, req)
	}
	if err == nil {
		err = a.limit(ctx, c, req)
	}
	if err != nil {
		a.audit(ctx, c, info.FullMethod, err)
		return nil, err
	}
	resp, err := handler(withScope(ctx, c), req)
	if a.audited(c, info.FullMethod) {
		a.audit(ctx, c, info.FullMethod, err)
	}
	return resp, err
}

// Ingest returns the interceptor the calls an ingest topic's records make
// pass: they act for the credential the auth file names for the topic
// ("ingest"), looked up at each call so that a reloaded file applies, and
// are checked, limited and scoped as that credential's own gRPC calls are.
// A topic the file names no credential for is refused with UNAUTHENTICATED
// at each call (the consumer waits, and logs it, until the file names
// one); Ingest itself reports it too, for the node to refuse to start.
func (a *Authorizer) Ingest(topic string) (grpc.UnaryServerInterceptor, error) {
	if a.table().ingest[topic] == nil {
		return nil, fmt.Errorf("the auth file names no credential for ingest topic %q: add \"ingest\": {%q: \"<a scheduler's name>\"}", topic, topic)
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		g := a.table().ingest[topic]
		if g == nil {
			return nil, status.Errorf(codes.Unauthenticated, "the auth file names no credential for ingest topic %q", topic)
		}
		c := caller{grant: g, name: g.Name + " (ingest topic " + topic + ")"}
		err := a.authorize(c, info.FullMethod)
		if err == nil {
			err = a.check(c, req)
		}
		if err == nil {
			err = a.limit(ctx, c, req)
		}
		if err != nil {
			return nil, err
		}
		return handler(withScope(ctx, c), req)
	}, nil
}

// audited reports whether a call that got through is written to the audit
// log: an admin's Admin calls, every call a node certificate makes on
// its own behalf to the client APIs, which no role or topic limits, and
// every call but a read a node makes for a signed-in console user: what
// an operator did by hand is kept.
func (a *Authorizer) audited(c caller, method string) bool {
	if c.actingFor {
		return !readMethods[method] && method != chimev1.Admin_GetClusterMap_FullMethodName &&
			method != chimev1.Admin_Status_FullMethodName && method != chimev1.Admin_GetTopicRateLimits_FullMethodName
	}
	if c.node {
		return !c.forwarded && !strings.HasPrefix(method, peerPrefix) && !strings.HasPrefix(method, reflectionPrefix)
	}
	return strings.HasPrefix(method, adminPrefix)
}

// StreamInterceptor authorizes every streaming call; a scheduler's request
// is checked when it arrives.
func (a *Authorizer) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	c, err := a.caller(ctx, info.FullMethod)
	if err != nil {
		a.audit(ctx, c, info.FullMethod, err)
		return err
	}
	err = handler(srv, &checkedStream{ServerStream: ss, ctx: withScope(ctx, c), a: a, c: c, method: info.FullMethod})
	if a.audited(c, info.FullMethod) {
		a.audit(ctx, c, info.FullMethod, err)
	}
	return err
}

type checkedStream struct {
	grpc.ServerStream
	ctx    context.Context // the stream's, with the caller's Scope
	a      *Authorizer
	c      caller
	method string
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	err := s.a.check(s.c, m)
	if err == nil {
		err = s.a.limit(s.Context(), s.c, m)
	}
	if err != nil {
		s.a.audit(s.Context(), s.c, s.method, err)
	}
	return err
}

// auditLine is one line of the audit log.
type auditLine struct {
	Time   string `json:"time"`
	Who    string `json:"who"`
	Peer   string `json:"peer,omitempty"`
	Method string `json:"method"`
	Result string `json:"result"`
	Detail string `json:"detail,omitempty"`
	// Repeated, on a refusal, counts the refusals of the same caller from
	// the same host since the line before, this one included; the line
	// is the latest of them.
	Repeated int `json:"repeated,omitempty"`
}

func (a *Authorizer) audit(ctx context.Context, c caller, method string, err error) {
	l := auditLine{Time: a.o.Now().UTC().Format(time.RFC3339Nano), Who: c.name, Method: method, Result: status.Code(err).String()}
	if err != nil {
		l.Detail = status.Convert(err).Message()
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		l.Peer = p.Addr.String()
	}
	if err != nil {
		a.refusals.add(l)
		return
	}
	a.write(l)
}

// Close writes what the audit log held back of repeated refusals, and
// stops the timers that would.
func (a *Authorizer) Close() { a.refusals.close() }

func (a *Authorizer) write(l auditLine) {
	if a.o.Audit == nil {
		a.o.Logger.Info("audit", "who", l.Who, "peer", l.Peer, "method", l.Method, "result", l.Result, "detail", l.Detail)
		return
	}
	b, _ := json.Marshal(l)
	a.auditMu.Lock()
	defer a.auditMu.Unlock()
	if _, err := a.o.Audit.Write(append(b, '\n')); err != nil {
		a.o.Logger.Error("writing the audit log", "err", err)
	}
}

// SignIn names the credential of a person signing in to the web console:
// the token when one is given, otherwise the client certificate the
// request's TLS connection presented. A node certificate signs no one in.
// A refusal is audited, and its error says why.
func (a *Authorizer) SignIn(r *http.Request, token string) (*Grant, error) {
	var id certs.Identity
	if token == "" && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && a.o.Identify != nil {
		id, _ = a.o.Identify(r.TLS.PeerCertificates)
	}
	var c caller
	var err error
	if id.Node {
		c, err = caller{name: "node certificate " + id.Name}, status.Error(codes.Unauthenticated, "a node certificate signs no one in: sign in with a token, or a client certificate listed in the auth file")
	} else {
		c, err = a.identify(token, token != "", id)
	}
	if err != nil {
		a.refusals.add(auditLine{Time: a.o.Now().UTC().Format(time.RFC3339Nano), Who: c.name, Peer: r.RemoteAddr, Method: "console sign-in",
			Result: status.Code(err).String(), Detail: status.Convert(err).Message()})
		return nil, errors.New(status.Convert(err).Message())
	}
	a.write(auditLine{Time: a.o.Now().UTC().Format(time.RFC3339Nano), Who: c.name, Peer: r.RemoteAddr, Method: "console sign-in", Result: codes.OK.String()})
	return c.grant, nil
}

// Grant returns the grant of the credential the auth file names name, or
// nil when it names none (any more).
func (a *Authorizer) Grant(name string) *Grant { return a.table().byName[name] }

// AdminHTTP lets only an admin (or a node) through to next: a bearer token
// in the Authorization header, or a client certificate listed in the file.
// Refusals are audited.
func (a *Authorizer) AdminHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id certs.Identity
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && a.o.Identify != nil {
			id, _ = a.o.Identify(r.TLS.PeerCertificates)
		}
		tok, has, err := bearer(metadata.Pairs("authorization", r.Header.Get("Authorization")))
		if r.Header.Get("Authorization") == "" {
			has, err = false, nil
		}
		var c caller
		if err == nil {
			c, err = a.identify(tok, has, id)
		}
		if err == nil && !c.node && c.grant.Role != RoleAdmin {
			err = status.Errorf(codes.PermissionDenied, "%s needs the admin role; %q is a %s", r.URL.Path, c.grant.Name, c.grant.Role)
		}
		if err != nil {
			a.refusals.add(auditLine{Time: a.o.Now().UTC().Format(time.RFC3339Nano), Who: c.name, Peer: r.RemoteAddr, Method: "HTTP " + r.URL.Path,
				Result: status.Code(err).String(), Detail: status.Convert(err).Message()})
			code := http.StatusForbidden
			if status.Code(err) == codes.Unauthenticated {
				code = http.StatusUnauthorized
			}
			http.Error(w, status.Convert(err).Message(), code)
			return
		}
		next.ServeHTTP(w, r)
	})
}
