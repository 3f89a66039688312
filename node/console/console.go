package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/auth"
)

// Mode is what the console lets a signed-in person do.
type Mode int

const (
	// Off serves no console.
	Off Mode = iota
	// ReadOnly shows every page and offers no action.
	ReadOnly
	// On offers the actions the credential's role permits.
	On
)

func (m Mode) String() string {
	switch m {
	case ReadOnly:
		return "read-only"
	case On:
		return "on"
	}
	return "off"
}

// ParseMode reads chimed --console: off, read-only or on.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "off":
		return Off, nil
	case "read-only":
		return ReadOnly, nil
	case "on":
		return On, nil
	}
	return Off, fmt.Errorf("--console must be off, read-only or on (got %q)", s)
}

// DefaultSessionTTL is how long a sign-in lasts.
const DefaultSessionTTL = 8 * time.Hour

// Config is what a Console needs from its node.
type Config struct {
	Mode Mode
	// Target is the node's own gRPC address, which the console dials as a
	// client; TLS, when set, is the client configuration it dials with (the
	// node's certificate, accepting only nodes).
	Target string
	TLS    *tls.Config
	// Auth, when set, makes every page ask for a sign-in, and every call
	// act for the signed-in credential.
	Auth *auth.Authorizer
	// SecureCookie marks the session cookie Secure: the HTTP port is TLS.
	SecureCookie bool
	// NodeID names the node in the page header.
	NodeID     string
	SessionTTL time.Duration // 0: DefaultSessionTTL
	Logger     *slog.Logger
	Now        func() time.Time // nil: time.Now
	// Metrics, when set, is the node's registry, which the timeliness page's
	// sampler reads (every sampleEvery, from New until Close).
	Metrics prometheus.Gatherer
}

// Console serves the web console. Its handler is mounted under /ui/.
type Console struct {
	cfg   Config
	pages map[string]*template.Template
	mux   *http.ServeMux

	mu       sync.Mutex
	sessions map[string]*session
	clients  map[string]*client.Client // by credential name ("" without auth)
	closed   bool

	jobs *jobs

	samples *sampler     // nil without Config.Metrics
	peers   *http.Client // fetches other nodes' timeliness figures; guarded by mu
}

type session struct {
	id      string
	csrf    string
	name    string    // the credential's name in the auth file; "" without auth
	role    auth.Role // "" without auth: everything
	expires time.Time
}

//go:embed templates static
var assets embed.FS

// New returns the console, sampling Config.Metrics from now on when set;
// Close stops its bulk jobs and its sampler and closes its connections.
func New(cfg Config) (*Console, error) {
	if cfg.Mode == Off {
		return nil, errors.New("console: mode is off")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Console{cfg: cfg, sessions: map[string]*session{}, clients: map[string]*client.Client{}, jobs: newJobs()}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c.pages = pages
	c.routes()
	if cfg.Metrics != nil {
		c.samples = newSampler(cfg.Metrics, cfg.Now)
	}
	return c, nil
}

// Handler serves the console's pages under /ui/.
func (c *Console) Handler() http.Handler { return c.mux }

// Close cancels the bulk jobs still running, waits for them, stops the
// metrics sampler, and closes the console's connections to the cluster.
func (c *Console) Close() error {
	c.jobs.close()
	if c.samples != nil {
		c.samples.close()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.peers != nil {
		c.peers.CloseIdleConnections()
	}
	var errs []error
	for name, cl := range c.clients {
		errs = append(errs, cl.Close())
		delete(c.clients, name)
	}
	return errors.Join(errs...)
}

func (c *Console) routes() {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /ui/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/events", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /ui/login", c.loginPage)
	mux.HandleFunc("POST /ui/login", c.login)
	mux.HandleFunc("POST /ui/logout", c.signedIn(c.logout))
	mux.HandleFunc("GET /ui/events", c.signedIn(c.startWithin(c.eventsPage, true)))
	mux.HandleFunc("GET /ui/events/count", c.signedInJSON(c.countEndpoint))
	mux.HandleFunc("GET /ui/event", c.signedIn(c.eventPage))
	mux.HandleFunc("POST /ui/event/{action}", c.acting(c.eventAction))
	mux.HandleFunc("GET /ui/bulk", c.signedIn(c.bulkPage))
	mux.HandleFunc("POST /ui/bulk", c.acting(c.bulkStart))
	mux.HandleFunc("GET /ui/jobs/{id}", c.signedIn(c.jobPage))
	mux.HandleFunc("GET /ui/recurring", c.signedIn(c.startWithin(c.recurringPage, false)))
	mux.HandleFunc("GET /ui/recurring/one", c.signedIn(c.recurringOnePage))
	mux.HandleFunc("GET /ui/recurring/last", c.signedInJSON(c.lastFiredEndpoint))
	mux.HandleFunc("POST /ui/recurring/{action}", c.acting(c.recurringAction))
	mux.HandleFunc("GET /ui/cluster", c.signedIn(c.clusterPage))
	mux.HandleFunc("POST /ui/cluster/{action}", c.acting(c.clusterAction))
	mux.HandleFunc("GET /ui/timeliness", c.signedIn(c.timelinessPage))
	mux.HandleFunc("GET /ui/timeliness.json", c.timelinessJSON)
	mux.HandleFunc("GET /ui/forecast", c.signedIn(c.forecastPage))
	c.mux = mux
}

const cookieName = "chime_console"

// sessionOf returns the request's live session, or nil.
func (c *Console) sessionOf(r *http.Request) *session {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[ck.Value]
	if s == nil {
		return nil
	}
	if !c.cfg.Now().Before(s.expires) {
		delete(c.sessions, s.id)
		return nil
	}
	return s
}

// newSession starts a session for the credential name (role) and sets its
// cookie. Expired sessions are swept out on the way.
func (c *Console) newSession(w http.ResponseWriter, name string, role auth.Role) *session {
	now := c.cfg.Now()
	s := &session{id: randomToken(), csrf: randomToken(), name: name, role: role, expires: now.Add(c.cfg.SessionTTL)}
	c.mu.Lock()
	for id, old := range c.sessions {
		if !now.Before(old.expires) {
			delete(c.sessions, id)
		}
	}
	c.sessions[s.id] = s
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.id, Path: "/ui/", Expires: s.expires,
		MaxAge: int(c.cfg.SessionTTL / time.Second), HttpOnly: true, Secure: c.cfg.SecureCookie, SameSite: http.SameSiteStrictMode})
	return s
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

type handler func(w http.ResponseWriter, r *http.Request, s *session)

// signedIn runs h for a signed-in session. Without an auth file every
// visitor is signed in, as no one, on first sight: the cookie then only
// carries the CSRF token of the visitor's forms.
func (c *Console) signedIn(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.sessionOf(r)
		if s == nil && c.cfg.Auth == nil {
			s = c.newSession(w, "", "")
		}
		if s == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/ui/login?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "not signed in, or the session expired: sign in again at /ui/login", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			if err := r.ParseForm(); err != nil {
				http.Error(w, "the form does not parse: "+err.Error(), http.StatusBadRequest)
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(s.csrf)) != 1 {
				http.Error(w, "the form's CSRF token is missing or not this session's: reload the page and try again", http.StatusForbidden)
				return
			}
		}
		w.Header().Set("Cache-Control", "no-store")
		h(w, r, s)
	}
}

// acting runs h, a change, for a signed-in session whose console is on and
// whose role can change things. The API decides the rest.
func (c *Console) acting(h handler) http.HandlerFunc {
	inner := c.signedIn(func(w http.ResponseWriter, r *http.Request, s *session) {
		if s.role == auth.RoleReader {
			http.Error(w, fmt.Sprintf("%q is a reader: it may look, not change", s.name), http.StatusForbidden)
			return
		}
		h(w, r, s)
	})
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.Mode != On {
			http.Error(w, "this node's console is read-only (chimed --console=read-only): use chimectl, or a node with --console=on", http.StatusForbidden)
			return
		}
		inner(w, r)
	}
}

// loginCookie carries the sign-in form's CSRF token (double submit): a
// page of another site cannot sign a browser in as someone else.
const loginCookie = "chime_console_login"

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Auth == nil {
		http.Redirect(w, r, "/ui/events", http.StatusSeeOther)
		return
	}
	c.render(w, r, nil, "login", http.StatusOK, map[string]any{"Next": safeNext(r.URL.Query().Get("next")), "CSRF": c.loginToken(w)})
}

// loginToken sets a fresh sign-in CSRF cookie and returns its value.
func (c *Console) loginToken(w http.ResponseWriter) string {
	tok := randomToken()
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: tok, Path: "/ui/login", MaxAge: 3600, HttpOnly: true,
		Secure: c.cfg.SecureCookie, SameSite: http.SameSiteStrictMode})
	return tok
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Auth == nil {
		http.Redirect(w, r, "/ui/events", http.StatusSeeOther)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, "the form does not parse: "+err.Error(), http.StatusBadRequest)
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	ck, err := r.Cookie(loginCookie)
	if err != nil || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(r.PostForm.Get("csrf"))) != 1 {
		c.render(w, r, nil, "login", http.StatusForbidden, map[string]any{"Next": next, "CSRF": c.loginToken(w),
			"Error": "the sign-in form's CSRF token is missing or stale: sign in again from this page"})
		return
	}
	g, err := c.cfg.Auth.SignIn(r, strings.TrimSpace(r.PostForm.Get("token")))
	if err != nil {
		c.render(w, r, nil, "login", http.StatusUnauthorized, map[string]any{"Next": next, "Error": err.Error(), "CSRF": c.loginToken(w)})
		return
	}
	c.newSession(w, g.Name, g.Role)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, s *session) {
	c.mu.Lock()
	delete(c.sessions, s.id)
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/ui/", MaxAge: -1, HttpOnly: true, Secure: c.cfg.SecureCookie, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// safeNext keeps a post-sign-in redirect inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/ui/events"
	}
	return next
}

// clientFor returns the client that acts for s's credential, dialling it
// on first use. One client serves every session of a credential.
func (c *Console) clientFor(s *session) (*client.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("the console is shutting down")
	}
	if cl := c.clients[s.name]; cl != nil {
		return cl, nil
	}
	var opts []client.Option
	if c.cfg.TLS != nil {
		opts = append(opts, client.WithTLS(c.cfg.TLS))
	}
	if s.name != "" {
		opts = append(opts, client.WithGRPCDialOptions(grpc.WithPerRPCCredentials(actingFor(s.name))))
	}
	cl, err := client.Dial(context.Background(), c.cfg.Target, opts...)
	if err != nil {
		return nil, err
	}
	c.clients[s.name] = cl
	return cl, nil
}

// callsFor returns the client acting for s and a context that bounds a
// page's calls to the cluster to timeout and ends with the request, which
// the caller cancels when done. When there is no client it shows the
// error page and ok is false: the handler then has nothing more to do.
func (c *Console) callsFor(w http.ResponseWriter, r *http.Request, s *session, timeout time.Duration) (cl *client.Client, ctx context.Context, cancel context.CancelFunc, ok bool) {
	cl, err := c.clientFor(s)
	if err != nil {
		c.fail(w, r, s, err)
		return nil, nil, nil, false
	}
	ctx, cancel = context.WithTimeout(r.Context(), timeout)
	return cl, ctx, cancel, true
}

// jsonCallsFor is callsFor for an endpoint a script reads: without a client
// it answers the error as JSON (failJSON) rather than with the error page.
func (c *Console) jsonCallsFor(w http.ResponseWriter, r *http.Request, s *session) (cl *client.Client, ctx context.Context, cancel context.CancelFunc, ok bool) {
	cl, err := c.clientFor(s)
	if err != nil {
		c.failJSON(w, err)
		return nil, nil, nil, false
	}
	ctx, cancel = context.WithTimeout(r.Context(), callTimeout)
	return cl, ctx, cancel, true
}

// actingFor names the credential a call is made for.
type actingFor string

func (a actingFor) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{chimev1.ActingForMetadata: string(a)}, nil
}

func (actingFor) RequireTransportSecurity() bool { return false }
