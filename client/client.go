package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/certs"
)

// Client is a connection to a Chime cluster. It is safe for concurrent use.
// Create it with Dial; Close it when done.
type Client struct {
	conn   *grpc.ClientConn // to the whole cluster, round robin
	addrs  []string         // what conn dials, for errors
	retry  RetryPolicy
	router *router

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ Scheduler = (*Client)(nil)

// Option configures Dial.
type Option func(*options)

type options struct {
	token     string
	tokenFile string
	tls       *tls.Config
	tlsFiles  *certs.Files
	retry     RetryPolicy
	routing   bool
	dialOpts  []grpc.DialOption
	// refreshEvery is how old the cluster map may grow before a call
	// refreshes it.
	refreshEvery time.Duration
}

// WithToken sends token as a bearer token with every call, for a cluster
// whose nodes check credentials (chimed --auth-file). A token is sent only
// in TLS, or in plaintext to a loopback address: Dial refuses anything else.
func WithToken(token string) Option { return func(o *options) { o.token, o.tokenFile = token, "" } }

// WithTokenFile is WithToken with the token read from a file (surrounding
// white space trimmed), read again whenever the file changes (its size or
// modification time), so a rotated token takes effect without a new
// Client. Dial fails if the file cannot be read; a call fails with
// ErrUnauthenticated while it cannot.
func WithTokenFile(path string) Option {
	return func(o *options) { o.tokenFile, o.token = path, "" }
}

// WithTLS talks to the nodes in TLS with cfg (a nil cfg verifies them
// against the system's roots). cfg's ServerName, when empty, is the host
// each connection dials.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.tls, o.tlsFiles = cfg, nil
	}
}

// WithTLSFiles talks to the nodes in TLS, verifying them against the CA
// bundle in the PEM file ca (the system's roots when empty) and presenting
// the client certificate in cert and its key in key (none when both are
// empty), as chimectl --tls-ca, --tls-cert and --tls-key do. The files are
// read at Dial and again when they change, so renewed certificates take
// effect without a new Client.
func WithTLSFiles(ca, cert, key string) Option {
	return func(o *options) {
		o.tlsFiles, o.tls = &certs.Files{CA: ca, Cert: cert, Key: key}, nil
	}
}

// WithRetry sets how calls are retried; see RetryPolicy (zero fields keep
// their default).
func WithRetry(p RetryPolicy) Option { return func(o *options) { o.retry = p } }

// WithLeaderRouting turns routing to shard leaders on (the default) or off.
// On, the client reads the cluster map (Admin.GetClusterMap) in the
// background and sends each call about one id straight to the leader of the
// id's shard, and splits a ScheduleBatch by shard; until the map is known,
// when it cannot be read (a credential without access to it), or when a
// leader does not answer, calls go to any node, which forwards them. Off,
// every call goes to any node.
func WithLeaderRouting(on bool) Option { return func(o *options) { o.routing = on } }

// WithGRPCDialOptions adds options to every gRPC connection the client
// makes, after its own (so they win): a custom dialer
// (grpc.WithContextDialer, as an in-memory bufconn listener needs),
// interceptors, a stats handler. For TLS, use WithTLS or WithTLSFiles rather
// than grpc.WithTransportCredentials: Dial's token check relies on them.
func WithGRPCDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// Keepalive of every connection: ping one that has been quiet this long,
// and drop it if the ping is not answered in time (chimed allows pings
// every 5s or more).
const (
	keepaliveTime    = 30 * time.Second
	keepaliveTimeout = 10 * time.Second
	// mapRefreshEvery is how old the cluster map grows before a call asks
	// for a fresh one.
	mapRefreshEvery = 30 * time.Second
)

// resolverScheme names the static list of addresses Dial resolves a
// comma-separated target to; each Client has its own resolver.
const resolverScheme = "chime-static"

// Dial returns a Client of the cluster at target: "host:port", a
// comma-separated list of them ("n1:7443,n2:7443,n3:7443"), or a gRPC
// target with a scheme, such as "dns:///chime.internal:7443" (every
// address the name resolves to). Calls are spread over the nodes (round
// robin) and fail over between them.
//
// Dial does not wait for a node: a node that cannot be reached shows as a
// call's error (ErrUnavailable, naming the addresses tried), within the
// call's context and RetryPolicy. ctx bounds only Dial's own work.
func Dial(ctx context.Context, target string, opts ...Option) (*Client, error) {
	o := options{routing: true, refreshEvery: mapRefreshEvery}
	for _, opt := range opts {
		opt(&o)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	grpcTarget, addrs, res, err := parseTarget(target)
	if err != nil {
		return nil, err
	}
	common, err := o.credentials()
	if err != nil {
		return nil, err
	}
	if o.token != "" || o.tokenFile != "" {
		for _, a := range addrs {
			if err := o.checkToken(a); err != nil {
				return nil, err
			}
		}
	}
	common = append(common, grpc.WithKeepaliveParams(keepalive.ClientParameters{
		Time: keepaliveTime, Timeout: keepaliveTimeout, PermitWithoutStream: true,
	}))
	var rt *router // set below, before any call can be made
	if o.routing {
		common = append(common, grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			var md metadata.MD
			err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&md))...)
			if len(md.Get(chimev1.LeaderMovedHeader)) > 0 {
				rt.forwarded()
			}
			return err
		}))
	}
	mainOpts := append([]grpc.DialOption{
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
	}, common...)
	if res != nil {
		mainOpts = append(mainOpts, grpc.WithResolvers(res))
	}
	mainOpts = append(mainOpts, o.dialOpts...)
	cc, err := grpc.NewClient(grpcTarget, mainOpts...)
	if err != nil {
		return nil, fmt.Errorf("chime: dial %q: %w", target, err)
	}
	c := &Client{conn: cc, addrs: addrs, retry: o.retry.withDefaults()}
	var dialLeader func(addr string) (*grpc.ClientConn, error)
	if o.routing {
		leaderOpts := slices.Concat(common, o.dialOpts)
		dialLeader = func(addr string) (*grpc.ClientConn, error) {
			if o.token != "" || o.tokenFile != "" {
				if err := o.checkToken(addr); err != nil {
					return nil, err
				}
			}
			return grpc.NewClient("passthrough:///"+addr, leaderOpts...)
		}
	}
	c.router = newRouter(cc, dialLeader, o.refreshEvery)
	rt = c.router
	return c, nil
}

// Close closes the client's connections and stops its background work.
// Calls in flight fail; calls made after Close fail with CANCELED.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.router.close()
		c.closeErr = c.conn.Close()
	})
	return c.closeErr
}

// Conn is the client's connection to the cluster, for the services and
// calls the client has no method for: chimev1.NewAdminClient(c.Conn()), or
// the raw chimev1.SchedulerClient and RecurringClient. It carries the
// client's credentials (TLS, token) and spreads calls over the nodes (round
// robin), as the client's own calls without a leader to go to.
//
// A call on Conn is sent once: no retries and no leader routing, which are
// the client's methods' own work (not a gRPC interceptor). Run a call that
// is safe to repeat through Do to have it retried. Close closes Conn.
func (c *Client) Conn() grpc.ClientConnInterface { return c.conn }

// Do runs f, a call on cc (the Conn), with the client's retries: f is
// called again, after a backoff, while its error is one the RetryPolicy
// repeats (UNAVAILABLE, ABORTED, an attempt's own timeout, a rate limit
// that frees up), within ctx and the policy. Each call of f gets its
// attempt's context. Use it only for calls that are safe to repeat: reads
// (Admin.GetClusterMap, Admin.Status), or changes the server recognises
// when they arrive twice. Do returns f's last error as gRPC gave it, not
// mapped to the client's errors.
func (c *Client) Do(ctx context.Context, f func(ctx context.Context, cc grpc.ClientConnInterface) error) error {
	_, _, err := c.call(ctx, "", false, f)
	return err
}

// parseTarget reads Dial's target: the gRPC target to dial, the addresses
// it names (for errors and the token check), and the resolver of a static
// list (nil for a target with its own scheme).
func parseTarget(target string) (string, []string, resolver.Builder, error) {
	target = strings.TrimSpace(target)
	if target == "" {
		return "", nil, nil, errors.New("chime: dial: empty target (want host:port, a comma-separated list of them, or dns:///name:port)")
	}
	if strings.Contains(target, "://") {
		return target, []string{target}, nil, nil
	}
	var addrs []string
	var state resolver.State
	for _, a := range strings.Split(target, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return "", nil, nil, fmt.Errorf("chime: dial %q: empty address in the list", target)
		}
		addrs = append(addrs, a)
		state.Endpoints = append(state.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r := manual.NewBuilderWithScheme(resolverScheme)
	r.InitialState(state)
	return resolverScheme + ":///" + addrs[0], addrs, r, nil
}

// credentials are the dial options every connection shares: transport
// security and the token.
func (o *options) credentials() ([]grpc.DialOption, error) {
	var tc credentials.TransportCredentials
	switch {
	case o.tls != nil:
		tc = credentials.NewTLS(o.tls.Clone())
	case o.tlsFiles != nil:
		src, err := certs.Load(*o.tlsFiles, nil)
		if err != nil {
			return nil, fmt.Errorf("chime: WithTLSFiles: %w", err)
		}
		tc = credentials.NewTLS(src.ClientConfig(""))
	default:
		tc = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(tc)}
	switch {
	case o.token != "":
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(o.token)))
	case o.tokenFile != "":
		tf := &tokenFile{path: o.tokenFile}
		if _, err := tf.get(); err != nil {
			return nil, fmt.Errorf("chime: WithTokenFile: %w", err)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(tf))
	}
	return opts, nil
}

func (o *options) secure() bool { return o.tls != nil || o.tlsFiles != nil }

// checkToken refuses to send a token in plaintext beyond this machine:
// anyone on the path could read it and act as its holder.
func (o *options) checkToken(addr string) error {
	if o.secure() || loopback(addr) {
		return nil
	}
	return fmt.Errorf("chime: refusing to send the bearer token in plaintext to %s, beyond this machine: add WithTLS or WithTLSFiles", addr)
}

// loopback reports whether addr (host:port, or a gRPC target ending in it)
// names this machine: a loopback IP or "localhost".
func loopback(addr string) bool {
	if i := strings.LastIndex(addr, "/"); i >= 0 {
		addr = addr[i+1:]
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// bearer is a token sent with every call.
type bearer string

// GetRequestMetadata sends the token as the authorization header.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false so that a token works with chimed dev
// on loopback; Dial refuses a token in plaintext to any other address.
func (bearer) RequireTransportSecurity() bool { return false }

// tokenFile is a token read from a file, read again when the file changes.
type tokenFile struct {
	path string

	mu    sync.Mutex
	mod   time.Time
	size  int64
	token string
}

func (t *tokenFile) get() (string, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return "", err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.token != "" && fi.ModTime().Equal(t.mod) && fi.Size() == t.size {
		return t.token, nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		return "", err
	}
	tok := string(bytes.TrimSpace(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", t.path)
	}
	t.token, t.mod, t.size = tok, fi.ModTime(), fi.Size()
	return tok, nil
}

// GetRequestMetadata sends the file's current token; a file that cannot be
// read fails the call with UNAUTHENTICATED (not retried).
func (t *tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := t.get()
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "chime: token file: %v", err)
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

// RequireTransportSecurity is false, as bearer's.
func (*tokenFile) RequireTransportSecurity() bool { return false }
