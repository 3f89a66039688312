package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
)

// node is one chimed process in its own namespace.
type node struct {
	i         int
	id        string
	ip        string
	dataDir   string
	logPath   string
	join      string
	shards    int
	retention time.Duration
	// wheelHorizon is chimed --wheel-horizon.
	wheelHorizon time.Duration
	// topicRateLimit is chimed --topic-rate-limit ("": none).
	topicRateLimit string
	// ingestTopics is chimed --ingest-topics ("": none).
	ingestTopics string

	mu sync.Mutex
	// build is the chimed the node runs, and runs again when restarted; the upgrade
	// nemesis changes it (setBuild).
	build   *chimedBuild
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool // SIGSTOPped
	killing bool // kill or stop ended (or is ending) the process
	refused bool // the process ended by itself refusing a format (checker.RefusedFormat)
	// parked: the membership nemesis drained the node and stopped it; it
	// stays down until that nemesis or the final heal starts it again.
	parked  bool
	crashes []checker.Crash

	// sec, with --secure, secures the node and the driver's calls to it.
	sec *security
	// disk is the filesystem mounted at dataDir when --nemesis names a disk fault, else nil.
	disk *disk

	// The node's clients, each dialled on first use to this node alone,
	// without leader routing: every call goes to this node, which forwards
	// what another node leads, as the test means.
	driverClient *client.Client // the driver's: admin with --secure
	schedClient  *client.Client // the workload's: the scheduler token with --secure
	tenantClient *client.Client // tenant A's, with --secure (tenants.go)
}

func (n *node) grpcAddr() string { return n.ip + ":7070" }
func (n *node) httpAddr() string { return n.ip + ":7080" }

// start launches chimed in the node's namespace. The process dies with the
// driver (Pdeathsig), so nothing outlives a crashed run.
func (n *node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	args, err := n.serveArgs()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fi, err := logf.Stat()
	if err != nil {
		_ = logf.Close() // nothing written yet; err says why
		return err
	}
	logStart := fi.Size() // where this process's output begins
	build := n.build
	args = build.args(args)
	cmd := exec.Command("ip", append([]string{"netns", "exec", nsName(n.i), build.bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close() // nothing written by this start; err says why
		return err
	}
	n.cmd, n.exited, n.stopped, n.killing, n.refused, n.parked = cmd, make(chan struct{}), false, false, false, false
	exited := n.exited
	go func() {
		err := cmd.Wait()
		at := time.Now()
		// The process wrote the log, and went: a close error here (the writes
		// went to the page cache) could not say what of it was lost.
		_ = logf.Close()
		n.mu.Lock()
		if !n.killing {
			c := checker.Crash{Node: n.id, AtNs: at.UnixNano(), Exit: fmt.Sprint(err),
				Line: whyEnded(n.logPath, logStart), Build: build.label}
			n.crashes = append(n.crashes, c)
			n.refused = checker.RefusedFormat(c)
		}
		n.mu.Unlock()
		close(exited)
	}()
	return nil
}

// whyEnded is the first line of a log, from offset on, that says why a Go process ended
// ("panic: ...", "fatal error: ...", or chimed's own line saying that its data directory
// cannot be written, after which other goroutines may still log), or else its last line.
func whyEnded(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || offset > int64(len(b)) {
		return fmt.Sprintf("(its log: %v)", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b[offset:])), "\n")
	for _, l := range lines {
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") || strings.Contains(l, checker.DiskExitLine) {
			return l
		}
	}
	return lines[len(lines)-1]
}

// orphansIn returns the lines of node's log at path that say its firing had lost an
// event, which its sweep put back.
func orphansIn(node, path string) []checker.Orphan {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []checker.Orphan
	for l := range strings.Lines(string(b)) {
		if strings.Contains(l, shard.OrphanMessage) {
			out = append(out, checker.Orphan{Node: node, Line: strings.TrimSpace(l)})
		}
	}
	return out
}

// ended is every time the node's process ended without kill ending it.
func (n *node) ended() []checker.Crash {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.crashes)
}

// serveArgs are the arguments of the node's chimed, of the current build: start drops
// those the node's build does not know.
func (n *node) serveArgs() ([]string, error) {
	args := []string{"serve",
		"--node-id", n.id, "--data-dir", n.dataDir,
		"--grpc-addr", n.grpcAddr(), "--http-addr", n.httpAddr(),
		"--raft-addr", n.ip + ":7071", "--gossip-addr", n.ip + ":7072",
		"--kafka-brokers", hostIP + ":" + kafkaPort, "--shards", fmt.Sprint(n.shards),
		"--dead-timeout", "1m", "--retention", n.retention.String(),
		"--wheel-horizon", n.wheelHorizon.String(), "--log-level", "info",
		// For the goroutine dumps the stall watch takes.
		"--debug-endpoints",
		// The embedded broker creates the workload's topics as they come,
		// and serves plaintext on the test's own bridge.
		"--kafka-auto-create-topics", "--kafka-insecure"}
	if n.topicRateLimit != "" {
		args = append(args, "--topic-rate-limit", n.topicRateLimit)
	}
	if n.ingestTopics != "" {
		args = append(args, "--ingest-topics", n.ingestTopics)
	}
	if n.sec == nil {
		// The nodes listen on the test's own bridge, in namespaces it created.
		args = append(args, "--insecure")
	} else {
		sf, err := n.sec.flags(n)
		if err != nil {
			return nil, err
		}
		args = append(args, sf...)
	}
	if n.join != "" {
		args = append(args, "--join", n.join)
	}
	return args, nil
}

// setBuild makes the node's next start run b.
func (n *node) setBuild(b *chimedBuild) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.build = b
}

// currentBuild is the build the node runs (or ran last, or runs when next started).
func (n *node) currentBuild() *chimedBuild {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.build
}

func (n *node) isParked() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.parked
}

func (n *node) alive() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// ending marks the node's process as ended by the driver (its end is no
// crash) and returns it and the channel closed when it has gone; cmd is nil
// when the node never started.
func (n *node) ending() (cmd *exec.Cmd, exited chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		n.killing = true
	}
	return n.cmd, n.exited
}

// kill sends SIGKILL and waits for the process to go.
func (n *node) kill() {
	cmd, exited := n.ending()
	if cmd == nil {
		return
	}
	// Signal fails only for a process that has already exited, which
	// exited then reports.
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused process must not linger
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop ends the process as an operator would before replacing its binary: SIGTERM, which
// chimed answers with a graceful shutdown (finishing in-flight requests and fire batches,
// within its --shutdown-timeout, 30 s), then SIGQUIT if it is still there after grace, and
// SIGKILL if that did not end it either. It
// returns how the process exited ("" when none was running): a graceful stop that exits
// non-zero is worth a look, though not a crash.
func (n *node) stop(grace time.Duration) string {
	cmd, exited := n.ending()
	if cmd == nil {
		return ""
	}
	select {
	case <-exited:
		return "" // it had ended already, and ended() has its crash if it was one
	default:
	}
	// As in kill: a signal fails only for a process that has already exited.
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return cmd.ProcessState.String()
	case <-time.After(grace):
	}
	// SIGQUIT makes a Go process write every goroutine's stack to its log before it
	// exits: what the shutdown waits on.
	_ = cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-exited:
		return fmt.Sprintf("still running %v after SIGTERM: quit (its goroutines are in its log)", grace)
	case <-time.After(5 * time.Second):
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return fmt.Sprintf("still running %v after SIGTERM, and after SIGQUIT: killed", grace)
}

// refusedLast reports whether the node's process is not running because its build refused
// data it cannot read (checker.RefusedFormat).
func (n *node) refusedLast() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.refused
}

func (n *node) signal(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		_ = n.cmd.Process.Signal(sig) // fails only for a process that has exited: nothing to signal
		n.stopped = sig == syscall.SIGSTOP
	}
}

// driver is the driver's client of the node: admin with --secure.
func (n *node) driver() *client.Client { return n.dial(&n.driverClient, "") }

// dial makes *cl once: plaintext, or with --secure in TLS with the driver's
// certificate and token as its bearer token unless empty.
func (n *node) dial(cl **client.Client, token string) *client.Client {
	n.mu.Lock()
	defer n.mu.Unlock()
	if *cl == nil {
		opts := []client.Option{client.WithLeaderRouting(false)}
		if n.sec != nil {
			opts = append(opts, n.sec.clientOptions(token)...)
		}
		c, err := client.Dial(context.Background(), n.grpcAddr(), opts...)
		if err != nil {
			// Dial fails only on a bad target or a token it may not send:
			// neither comes from the run's conditions.
			panic(fmt.Sprintf("chime-jepsen: dialling %s: %v", n.id, err))
		}
		*cl = c
	}
	return *cl
}

// closeClients closes the node's clients.
func (n *node) closeClients() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, cl := range []**client.Client{&n.driverClient, &n.schedClient, &n.tenantClient} {
		if *cl != nil {
			_ = (*cl).Close() // the run is over for these clients; a close error changes no result
			*cl = nil
		}
	}
}

// The workload's calls are raw stubs on its client's connection (Conn),
// sent once each: the checker judges every call's own outcome, so a call
// must not be retried or read back behind the history's back (a read-back
// that finds another op's later change would report a conflict for a
// schedule that took effect).

func (n *node) scheduler() chimev1.SchedulerClient { return chimev1.NewSchedulerClient(n.workload()) }

// recurring is the Recurring service, with the workload's credentials as scheduler.
func (n *node) recurring() chimev1.RecurringClient { return chimev1.NewRecurringClient(n.workload()) }

// workload is the connection the workload's calls go on: with --secure, the one that
// carries the workload's scheduler token.
func (n *node) workload() grpc.ClientConnInterface {
	if n.sec == nil {
		return n.driver().Conn()
	}
	return n.dial(&n.schedClient, n.sec.token).Conn()
}

// tenant is tenant A's connection (tenants.go); nil without --secure.
func (n *node) tenant() grpc.ClientConnInterface {
	if n.sec == nil {
		return nil
	}
	return n.dial(&n.tenantClient, n.sec.tenantToken).Conn()
}

func (n *node) admin() chimev1.AdminClient {
	return chimev1.NewAdminClient(n.driver().Conn())
}

// setClockOffset skews the node's clock (a chimefault build's debug handler).
func (n *node) setClockOffset(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := n.debugHTTP(ctx, http.MethodPost, fmt.Sprintf("/debug/fault/clock-offset?ns=%d", d.Nanoseconds()))
	return err
}

// goroutines returns what every goroutine of the node is doing (its
// --debug-endpoints profile).
func (n *node) goroutines(ctx context.Context) ([]byte, error) {
	return n.debugHTTP(ctx, http.MethodGet, "/debug/pprof/goroutine?debug=2")
}

// debugHTTP calls one of the node's debug handlers on its HTTP port, as the
// driver (a node's certificate, which the admin-only handlers accept), and
// returns the body of a 200.
func (n *node) debugHTTP(ctx context.Context, method, path string) ([]byte, error) {
	scheme, client := "http", http.DefaultClient
	if n.sec != nil {
		scheme, client = "https", n.sec.httpClient()
	}
	req, err := http.NewRequestWithContext(ctx, method, scheme+"://"+n.httpAddr()+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }() // read to the end or given up on
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s on %s: %s", method, path, n.id, resp.Status)
	}
	return body, nil
}

// buildChimed builds the daemon with the fault-test clock into dir.
func buildChimed(dir string) (string, error) {
	bin := filepath.Join(dir, "chimed")
	cmd := exec.Command("go", "build", "-tags", "chimefault", "-o", bin, "./cmd/chimed")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -tags chimefault ./cmd/chimed: %v\n%s", err, out)
	}
	return bin, nil
}

// cluster is the set of nodes of a run. The membership nemesis changes it
// while the workload and the other nemeses read it, hence mu.
type cluster struct {
	// slots is the number of network namespaces: node i lives in slot i
	// (nsName, nodeIP); a node the run removed frees its slot for a new one.
	slots int

	mu sync.Mutex
	// nodes are the members: every node the run started and has not removed,
	// running or not.
	nodes []*node
	// removed are the nodes the run removed for good (RemoveNode): killed,
	// never started again, and never to hold a replica.
	removed []*node
	// newNode makes the node with the given id in slot i (not started).
	newNode func(i int, id string) *node
	// nextID numbers the nodes the membership nemesis adds: n<nextID>.
	nextID int
	// diskDir, when the run has disk faults, is where each node's
	// filesystem image is made (giveDisk).
	diskDir string
}

// members are the nodes the run has not removed.
func (c *cluster) members() []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodes)
}

// active are the members the workload and the other nemeses use: all but
// those drained and stopped by the membership nemesis, which a client no
// longer reaches and a fault cannot touch.
func (c *cluster) active() []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(c.nodes), (*node).isParked)
}

// everyNode is every node the run started, members and removed.
func (c *cluster) everyNode() []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(slices.Clone(c.nodes), c.removed...)
}

// status asks any answering node for the cluster status.
func (c *cluster) status(ctx context.Context) (*chimev1.StatusResponse, error) {
	var last error
	for _, n := range c.active() {
		if !n.alive() {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := n.admin().Status(ctx, &chimev1.StatusRequest{})
		cancel()
		if err == nil {
			return st, nil
		}
		last = err
	}
	return nil, fmt.Errorf("no node answered Status: %v", last)
}

// waitConverged waits until every shard has a leader and its desired voters.
func (c *cluster) waitConverged(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		st, err := c.status(ctx)
		if err == nil {
			ok := len(st.Shards) > 0
			for _, s := range st.Shards {
				ok = ok && s.Leader != "" && len(s.Nonvoters) == 0 && len(s.Voters) == len(s.Desired) && len(s.Desired) > 0
			}
			if ok {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not converged after %v (last error: %v)", d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// leaderOfMost returns the node leading the most shards.
func (c *cluster) leaderOfMost(ctx context.Context) *node {
	ns := c.active()
	st, err := c.status(ctx)
	if err != nil {
		return ns[0]
	}
	counts := map[string]int{}
	for _, s := range st.Shards {
		counts[s.Leader]++
	}
	best := ns[0]
	for _, n := range ns {
		if counts[n.id] > counts[best.id] {
			best = n
		}
	}
	return best
}

func ids(ns []*node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.id)
	}
	return out
}

func joinIDs(ns []*node) string { return strings.Join(ids(ns), ",") }
