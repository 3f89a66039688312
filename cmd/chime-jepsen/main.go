// Command chime-jepsen is Chime's fault-test driver, in the manner of Jepsen:
// it runs real chimed processes in network namespaces of its own, a client
// workload that records every operation in a history, and a nemesis that
// kills, pauses, partitions, slows, skews, cuts nodes off from Kafka, fills
// or freezes their disks, joins, drains, removes, replaces and upgrades nodes
// on a schedule, and a backer that takes a backup of the live cluster every
// --backup-every; after a final heal it reads every record from Kafka with a
// client of its own and checks the history, backups included, against
// Chime's promises.
//
//	sudo go run ./cmd/chime-jepsen --time-limit 10m --nemesis mixed --out jepsen-out
//
// It needs root (network namespaces, iptables, tc; with the disk faults,
// loop devices, mkfs.ext4, mount and fsfreeze) and touches only the
// namespaces, bridge and addresses (10.77.0.0/24) and the loop devices of
// images in its --out folder it creates, all removed when it ends.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish"
)

const kafkaPort = "9092"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	timeLimit, maxDelay, drain time.Duration
	retention, wheelHorizon    time.Duration
	backupEvery                time.Duration
	nemesis, out               string
	seed                       uint64
	secure                     bool
	nodes, clients, shards     int
	burstSize, burstRate       int
	burstEvery                 time.Duration
	ingestShare                float64
	// oldCommit and oldBinary are the build the upgrade nemesis starts on; oldGiven says
	// that one of them was given, which lets mixed draw upgrade.
	oldCommit, oldBinary string
	oldGiven             bool
}

func run(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("chime-jepsen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.timeLimit, "time-limit", 5*time.Minute, "how long the workload and the nemesis run (then: final heal, drain, read, check)")
	fs.StringVar(&o.nemesis, "nemesis", "mixed", "faults to inject: mixed, none, or a comma-separated list of "+strings.Join(faultKinds, ", ")+
		";\nmixed draws upgrade only when --old-commit or --old-binary is given")
	fs.StringVar(&o.oldCommit, "old-commit", defaultOldCommit, "with the upgrade nemesis: the commit of this repository whose chimed (built with -tags chimefault\n"+
		"into <out>/chimed-old) the cluster starts on; the default is the last commit that changed a\n"+
		"Raft entry, stored value or snapshot format (46e202a: the Recurring command's Trigger and\n"+
		"Backfill ops). Flags the driver passes that its serve --help does not list are dropped")
	fs.StringVar(&o.oldBinary, "old-binary", "", "with the upgrade nemesis: a chimed to start the cluster on instead of building --old-commit")
	fs.StringVar(&o.out, "out", "", "directory for the run's history, records, results.json and report.html (default jepsen-out/<time>)")
	fs.Uint64Var(&o.seed, "seed", 0, "random seed for the workload and the nemesis (default: from the clock; printed and saved)")
	fs.BoolVar(&o.secure, "secure", false, "run the cluster secured: TLS on every port with client certificates (CAs made for the run, in\n<out>/pki), an auth file, the workload with a scheduler token and the driver with an admin\ncertificate, and two tenants: tenant A's own events, and a client with A's token that keeps trying the\nworkload's ids and schedules (checker: tenant_violations)")
	fs.IntVar(&o.nodes, "nodes", 5, "chimed processes, one per network namespace")
	fs.IntVar(&o.clients, "clients", 8, "concurrent client workers")
	fs.IntVar(&o.shards, "shards", 8, "shards of the cluster under test")
	fs.DurationVar(&o.maxDelay, "max-delay", 2*time.Minute, "longest delay a scheduled event gets")
	fs.DurationVar(&o.retention, "retention", 7*24*time.Hour, "chimed --retention for the cluster under test (0 keeps settled events forever); the checker holds removals to it")
	fs.DurationVar(&o.wheelHorizon, "wheel-horizon", time.Hour, "chimed --wheel-horizon for every node: events due later wait on disk and are loaded as the\nhorizon reaches them; shorter than --max-delay, the loads run throughout the test")
	fs.DurationVar(&o.drain, "drain", 30*time.Second, "how long to keep reading after the last event fell due")
	fs.DurationVar(&o.backupEvery, "backup-every", time.Minute, "take a backup of the live cluster this often, as chimectl backup does, into <out>/backup-NNN\n(0: none); the checker holds each to the history")
	fs.IntVar(&o.burstSize, "burst-size", 300, "events in each burst: all on one shard (shards in turn), due at once 2 s after they are sent,\nwith priorities 0-9, on topic "+burstTopic+", which the nodes rate-limit; the checker holds the\nleader to producing higher priorities first (0: no bursts, and no --topic-rate-limit)")
	fs.DurationVar(&o.burstEvery, "burst-every", 15*time.Second, "send a burst this often (the first 3 s into the workload; 0: no bursts)")
	fs.IntVar(&o.burstRate, "burst-rate", 0, "chimed --topic-rate-limit "+burstTopic+"=N/s for every node: the cluster's rate, of which each\nshard's leader enforces N/--shards (0: --burst-size/2 × --shards, so that a burst takes about 2 s\nto drain)")
	fs.Float64Var(&o.ingestShare, "ingest-share", 0.2, "the share of new events scheduled by producing a record to the ingest topic "+ingestTopic+"\n"+
		"(docs/ingest.md; every node runs with --ingest-topics "+ingestTopic+"), some followed by a tombstone\n"+
		"or a second record of their key (checker: ingest_lost, ingest_after_tombstone, ingest_after_replace,\n"+
		"ingest_rejected); 0: none, and the nodes consume no ingest topic")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: chime-jepsen [flags]   (as root)

Runs a Jepsen-style fault test of Chime: --nodes chimed processes in network
namespaces joined by a bridge, a Kafka-protocol broker on the host side, a
workload of schedules (delays from 0 to --max-delay, some on tick boundaries),
some with a priority or a window, re-sends (identical and conflicting,
sometimes to two nodes at once), cancels (well before, within 50 ms of, and
after due), updates, upserts, gets, lists and bulk cancels (CancelMatching) by
id prefix, invalid requests, recurring schedules, every --burst-every a
burst of --burst-size events due at once on one shard, on a topic the nodes
rate-limit, and --ingest-share of the new events produced as records to the
ingest topic (some tombstoned or produced again); and a nemesis that injects one
fault about every 10 s, every kind once before any repeats. The membership
fault changes who the members are, as an operator does: it joins a new node,
drains a node and stops it, kills a node, removes it (RemoveNode) and joins a
fresh one in its place (maybe at the removed node's address), or starts a
drained node again, keeping --nodes ± 1 running; a drain or a removal waits
until every shard is back at its replication factor. A run whose kinds
include it changes the membership first. With upgrade, the cluster starts on
the chimed of --old-commit, or --old-binary, and the nemesis moves one node at
a time to the current build and, once all run it, back. With disk-full or
disk-stall, each node's data directory is an ext4 of 1 GiB on a loop device the
driver makes; disk-full fills that of the leader of most shards with ballast,
disk-stall freezes it with fsfreeze for 3-30 s, beyond chimed's
--disk-failure-timeout about a third of the time (a node that stops saying its
disk failed, in such a window, is a disk exit, not a crash). Every
--backup-every it takes a backup of the live cluster, through the code
chimectl backup runs, from a node picked at random, into the run's folder.
After the final heal and a drain it reads every record back and checks:
nothing acknowledged lost, nothing early, nothing after an acknowledged cancel
(or a bulk cancel that certainly cancelled it), no phantom record,
idempotency, no get or list showing a state older than a change acknowledged
before it began or leaving out an event it had to show, bulk cancel totals
that add up, retention (no event gone early, none back after it was gone),
backups (each completed backup holds every event acknowledged before it began,
in a state the history allows, and no event never sent; a failed one leaves no
manifest), priority (in each burst clear of faults, no lower-priority event
produced clearly before a higher-priority one), the ingest topic (every
acknowledged record whose key was not tombstoned or produced again fires,
none before its delay counted from its produce, none long after a later record
of its key superseded it, none rejected), duplicates by fault, lateness
per period, recovery time per fault, that all replicas converged, every
shard ending with 3 voters (the replication factor) on running members and
none on a removed node, and that no node ended by itself (but for the old
build refusing, loudly, what the current one wrote: format_refusals). Exits 0
when the run is valid, 1 when a check failed.

Flags:
`)
		fs.PrintDefaults()
		fmt.Fprint(stderr, `
Examples:
  sudo go run ./cmd/chime-jepsen --time-limit 10m
  sudo go run ./cmd/chime-jepsen --time-limit 2m --nemesis partition-halves,kill-leader --seed 42
  sudo go run ./cmd/chime-jepsen --time-limit 90s --backup-every 20s --out /tmp/jepsen-backups
  sudo go run ./cmd/chime-jepsen --time-limit 2m --nemesis none --burst-size 600 --burst-every 8s
  sudo go run ./cmd/chime-jepsen --time-limit 2m --nemesis kafka-cut --ingest-share 0.5
  sudo go run ./cmd/chime-jepsen --time-limit 2m --nemesis upgrade --secure
  sudo go run ./cmd/chime-jepsen --time-limit 2m --nemesis disk-full,disk-stall
`)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "chime-jepsen: must run as root: it creates network namespaces, a bridge, veth pairs and iptables rules, and for the disk faults loop devices and mounts (try: sudo go run ./cmd/chime-jepsen)")
		return 2
	}
	if o.backupEvery < 0 {
		fmt.Fprintln(stderr, "chime-jepsen: --backup-every must not be negative (0 takes no backups)")
		return 2
	}
	if o.burstSize < 0 || o.burstEvery < 0 || o.burstRate < 0 {
		fmt.Fprintln(stderr, "chime-jepsen: --burst-size, --burst-every and --burst-rate must not be negative (--burst-size 0 or --burst-every 0 sends no bursts)")
		return 2
	}
	if o.burstEvery == 0 {
		o.burstSize = 0
	}
	if o.ingestShare < 0 || o.ingestShare > 1 {
		fmt.Fprintln(stderr, "chime-jepsen: --ingest-share must be between 0 and 1 (0 produces nothing to the ingest topic)")
		return 2
	}
	fs.Visit(func(f *flag.Flag) { o.oldGiven = o.oldGiven || f.Name == "old-commit" || f.Name == "old-binary" })
	kinds, err := nemesisKinds(o.nemesis, o.oldGiven)
	if err != nil {
		fmt.Fprintf(stderr, "chime-jepsen: --nemesis: %v\n", err)
		return 2
	}
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	if o.out == "" {
		o.out = filepath.Join("jepsen-out", time.Now().Format("20060102-150405"))
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	res, err := runTest(o, kinds, logger)
	if err != nil {
		logger.Error("run failed", "err", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\nreport: %s\n", summary(res), filepath.Join(o.out, "report.html"))
	if !res.Valid {
		return 1
	}
	return 0
}

// nemesisKinds are the faults --nemesis names. mixed draws upgrade only when the old build
// was chosen (withUpgrade): starting every mixed run on an older build would make every
// other fault's findings about that build.
func nemesisKinds(s string, withUpgrade bool) ([]string, error) {
	switch s {
	case "mixed":
		if withUpgrade {
			return faultKinds, nil
		}
		return slices.DeleteFunc(slices.Clone(faultKinds), func(k string) bool { return k == "upgrade" }), nil
	case "none", "":
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(faultKinds, k) {
			return nil, fmt.Errorf("unknown fault %q (known: mixed, none, %s)", k, strings.Join(faultKinds, ", "))
		}
		out = append(out, k)
	}
	return out, nil
}

func runTest(o options, kinds []string, logger *slog.Logger) (checker.Results, error) {
	var res checker.Results
	// The nodes' data directories live in the run's folder: reusing one
	// would start the cluster from an old state.
	if entries, err := os.ReadDir(o.out); err == nil && len(entries) > 0 {
		return res, fmt.Errorf("--out %s already holds a run; choose another folder or remove it", o.out)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return res, err
	}
	out, _ := filepath.Abs(o.out)
	// The seed is what replays the run: a run whose seed was not kept is
	// not worth starting.
	if err := os.WriteFile(filepath.Join(out, "seed"), []byte(fmt.Sprintln(o.seed)), 0o644); err != nil {
		return res, err
	}
	rateLimit := burstRateLimit(o.burstSize, o.shards, o.burstRate)
	logger.Info("chime-jepsen", "out", out, "seed", o.seed, "nodes", o.nodes, "time-limit", o.timeLimit, "nemesis", kinds, "backup-every", o.backupEvery, "secure", o.secure,
		"burst-size", o.burstSize, "burst-every", o.burstEvery, "topic-rate-limit", rateLimit, "ingest-share", o.ingestShare)

	bin, err := buildChimed(out)
	if err != nil {
		return res, err
	}
	// With the upgrade nemesis every node starts on the old build; its crashes are labelled
	// with the build that ran.
	current, old := &chimedBuild{bin: bin}, (*chimedBuild)(nil)
	first := current
	if slices.Contains(kinds, "upgrade") {
		if current, old, err = upgradeBuilds(o, out, bin, logger); err != nil {
			return res, err
		}
		first = old
	}
	// The membership nemesis adds a node before it stops or removes one:
	// the cluster grows to --nodes+1, and a new node may take the slot of
	// one removed, so one more slot than that is never needed.
	slots := o.nodes
	if slices.Contains(kinds, "membership") {
		slots = o.nodes + 2
	}
	if err := setupNetwork(slots); err != nil {
		teardownNetwork(slots)
		return res, fmt.Errorf("network: %w", err)
	}
	defer teardownNetwork(slots)

	// The broker runs here, on the host side of the bridge, so "when did a
	// record reach Kafka" is measured on the same clock as the history
	// (appendLog).
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4),
		kfake.Ports(9092), kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(hostIP, kafkaPort))
		}))
	if err != nil {
		return res, fmt.Errorf("broker: %w", err)
	}
	defer broker.Close()
	appends := watchProduces(broker)

	// The ingest topic exists, with its partitions, before any node joins
	// the group.
	var ingestProducer *kgo.Client
	ingestTopics := ""
	if o.ingestShare > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ingestProducer, err = newIngestProducer(ctx, net.JoinHostPort(hostIP, kafkaPort))
		cancel()
		if err != nil {
			return res, fmt.Errorf("ingest: %w", err)
		}
		defer ingestProducer.Close()
		ingestTopics = ingestTopic
	}

	var sec *security
	if o.secure {
		if sec, err = newSecurity(out, ingestTopics); err != nil {
			return res, fmt.Errorf("--secure: %w", err)
		}
	}
	c := &cluster{slots: slots, nextID: o.nodes + 1, newNode: func(i int, id string) *node {
		return &node{i: i, id: id, ip: nodeIP(i), dataDir: filepath.Join(out, id),
			logPath: filepath.Join(out, id+".log"), build: current, shards: o.shards, retention: o.retention,
			wheelHorizon: o.wheelHorizon, topicRateLimit: rateLimit, ingestTopics: ingestTopics, sec: sec}
	}}
	for i := 1; i <= o.nodes; i++ {
		n := c.newNode(i, fmt.Sprintf("n%d", i))
		n.build = first // a node the membership nemesis adds later runs the current build
		if i > 1 {
			n.join = nodeIP(1) + ":7072"
		}
		c.nodes = append(c.nodes, n)
	}
	if slices.ContainsFunc(kinds, func(k string) bool { return slices.Contains(checker.DiskFaultKinds, k) }) {
		cleanupDisks()
		c.diskDir = out // the nodes the membership nemesis adds get one too
		defer func() {  // after the kill below: a mounted filesystem in use does not unmount
			for _, n := range c.everyNode() {
				if n.disk == nil {
					continue
				}
				if used, err := n.disk.used(); err == nil {
					logger.Info("node filesystem", "node", n.id, "used", fmt.Sprintf("%.1f MiB", float64(used)/(1<<20)))
				}
				n.disk.teardown()
			}
		}()
		for _, n := range c.nodes {
			if err := c.giveDisk(n); err != nil {
				return res, err
			}
		}
	}
	defer func() {
		for _, n := range c.everyNode() {
			n.closeClients()
			// A process whose filesystem is frozen cannot end (its threads wait in the
			// kernel for the thaw): kill would wait forever.
			if n.disk != nil {
				n.disk.thaw()
			}
			n.kill()
		}
	}()
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			return res, err
		}
		time.Sleep(300 * time.Millisecond) // the first node creates the cluster before the others join
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.waitConverged(ctx, 90*time.Second); err != nil {
		return res, err
	}
	if old != nil {
		args, err := c.nodes[0].serveArgs()
		if err != nil {
			return res, err
		}
		if dropped := old.droppedFlags(args); len(dropped) > 0 {
			logger.Warn("the old build does not know these flags of the driver; its nodes run without them", "flags", dropped)
		}
	}
	logger.Info("cluster converged; starting workload and nemesis")
	// The stall watch runs through the workload and the final heal; the
	// drain that follows is silent by design.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		appends.watchStalls(watchCtx, out, c.members, logger)
	}()
	stopWatching := func() {
		stopWatch()
		<-watchDone
	}
	defer stopWatching()

	h := &history{}
	w := &workload{c: c, h: h, maxDelay: o.maxDelay, opTimeout: 5 * time.Second, retention: o.retention,
		shards: o.shards, burstSize: o.burstSize, burstEvery: o.burstEvery, tenants: o.secure, versions: map[string]uint64{},
		ingest: ingestProducer, ingestShare: o.ingestShare}
	nm := &nemesis{c: c, size: o.nodes, h: h, kinds: kinds, r: newRand(o.seed, 7), logger: logger, current: current, old: old}
	start := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, o.timeLimit)
	done := make(chan struct{})
	go func() {
		nm.run(runCtx, 10*time.Second)
		close(done)
	}()
	// The backer stops taking backups with the workload and finishes the one
	// under way, if any, after the final heal.
	backupsDone := make(chan struct{})
	go func() {
		defer close(backupsDone)
		if o.backupEvery > 0 {
			bk := &backer{c: c, h: h, out: out, every: o.backupEvery, r: newRand(o.seed, 0xbac), logger: logger}
			bk.run(runCtx, ctx)
		}
	}()
	w.run(runCtx, o.clients, o.seed)
	cancel()
	<-done
	nm.finalHeal()
	finalHeal := time.Now()
	<-backupsDone
	logger.Info("final heal", "ops", len(h.snapshot()), "ran", time.Since(start).Round(time.Second))
	stopWatching()

	// Drain: wait until every event fell due (plus the drain period), then
	// read everything back.
	w.mu.Lock()
	lastDue := w.maxDue
	w.mu.Unlock()
	wait := time.Until(lastDue.Add(o.drain))
	wait = max(wait, o.drain)
	logger.Info("draining", "until", time.Now().Add(wait).Format(time.TimeOnly))
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(wait):
	}
	recs, err := readRecords(ctx, []string{net.JoinHostPort(hostIP, kafkaPort)}, appends, logger)
	if err != nil {
		return res, err
	}
	final, err := finalState(ctx, c, logger)
	if err != nil {
		logger.Warn("final state", "err", err)
	}
	for _, n := range c.everyNode() {
		final.Crashes = append(final.Crashes, n.ended()...)
		final.Orphans = append(final.Orphans, orphansIn(n.id, n.logPath)...)
	}
	for _, cr := range final.Crashes {
		logger.Error("a node ended by itself", "node", cr.Node, "at", time.Unix(0, cr.AtNs).Format(time.TimeOnly), "exit", cr.Exit, "why", cr.Line)
	}
	ops := h.snapshot()
	if err := checker.WriteJSONL(filepath.Join(out, "history.jsonl"), ops); err != nil {
		return res, err
	}
	if err := checker.WriteJSONL(filepath.Join(out, "records.jsonl"), recs); err != nil {
		return res, err
	}
	res = checker.Check(ops, recs, final, checker.Config{FinalHealNs: finalHeal.UnixNano(), Retention: o.retention})
	if err := checker.WriteReport(out, ops, recs, res); err != nil {
		return res, err
	}
	return res, nil
}

// upgradeBuilds are the current build and the old one the upgrade nemesis starts on:
// --old-binary, or --old-commit built into out.
func upgradeBuilds(o options, out, bin string, logger *slog.Logger) (current, old *chimedBuild, err error) {
	oldBin := o.oldBinary
	if oldBin == "" {
		logger.Info("building the old chimed", "commit", o.oldCommit)
		if oldBin, err = buildOldChimed(out, o.oldCommit); err != nil {
			return nil, nil, err
		}
	}
	return newBuilds(bin, oldBin)
}

// readRecords reads every record of every Chime topic from the start, until
// a few seconds pass with nothing new.
func readRecords(ctx context.Context, brokers []string, appends *appendLog, logger *slog.Logger) ([]checker.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(append(slices.Clone(topics), recurringTopic, burstTopic, tenantTopic, publish.DefaultDeadLetterTopic,
			checker.DefaultIngestRejectedTopic)...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var recs []checker.Record
	unmatched := 0
	quiet := time.Now()
	for time.Since(quiet) < 5*time.Second && ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		now := time.Now().UnixNano()
		fs.EachRecord(func(r *kgo.Record) {
			quiet = time.Now()
			rec := checker.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Payload: string(r.Value),
				AppendMs: r.Timestamp.UnixMilli(), ReceivedNs: now}
			if r.Topic == checker.DefaultIngestRejectedTopic {
				// A record Chime could not apply: its id is <its ingest
				// topic>/<key>, as Chime names it, and chime-error says why.
				rec.ID, rec.Error = rejectedID(r), header(r, "chime-error")
				recs = append(recs, rec)
				return
			}
			h, _ := chimev1.ParseHeaders(r.Headers) // a malformed header leaves its field zero, as before
			rec.ID, rec.Attempt, rec.Version = h.ID, h.Attempt, h.Version
			rec.RecurringID = h.RecurringID
			if !h.Occurrence.IsZero() {
				rec.OccurrenceMs = h.Occurrence.UnixMilli()
			}
			if !h.Due.IsZero() {
				rec.DueMs = h.Due.UnixMilli()
			}
			if !h.Fired.IsZero() {
				rec.FiredMs = h.Fired.UnixMilli()
			}
			k := keyOf(r.Topic, h)
			if at, ok := appends.lookup(k); ok {
				rec.AppendMs = at / 1e6
			} else {
				unmatched++
			}
			recs = append(recs, rec)
		})
	}
	if unmatched > 0 {
		logger.Warn("records whose produce request was not seen; their append time is the producer's timestamp", "records", unmatched)
	}
	return recs, ctx.Err()
}

// rejectedID is the event id a record on the rejected topic would have had:
// <the topic of its chime-source>/<its key>.
func rejectedID(r *kgo.Record) string {
	src, _, _ := strings.Cut(header(r, "chime-source"), "/")
	return src + "/" + string(r.Key)
}

// header is the value of r's header key, "" when it has none.
func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// finalState waits (up to a minute) until every shard has one leader and
// its replicas agree, and returns what it saw last.
func finalState(ctx context.Context, c *cluster, logger *slog.Logger) (checker.Cluster, error) {
	var last checker.Cluster
	deadline := time.Now().Add(time.Minute)
	for {
		last = snapshotState(ctx, c)
		if len(checker.ConvergenceProblems(last)) == 0 {
			return last, nil
		}
		if time.Now().After(deadline) {
			return last, errors.New("replicas did not converge within a minute of the drain")
		}
		time.Sleep(time.Second)
	}
}

// replication is the clusters' replication factor: chimed's default, which
// the driver does not change.
const replication = 3

func snapshotState(ctx context.Context, c *cluster) checker.Cluster {
	out := checker.Cluster{Replication: replication}
	for _, n := range c.members() {
		if n.alive() {
			out.Live = append(out.Live, n.id)
		}
	}
	c.mu.Lock()
	out.Removed = ids(c.removed)
	c.mu.Unlock()
	byShard := map[uint32]*checker.ShardState{}
	members := map[uint32][]string{} // the leader's voters and non-voters
	for _, n := range c.members() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := n.admin().NodeStatus(cctx, &chimev1.NodeStatusRequest{Digest: true})
		cancel()
		if err != nil {
			continue
		}
		for _, r := range st.Replicas {
			s := byShard[r.Shard]
			if s == nil {
				s = &checker.ShardState{ID: r.Shard}
				byShard[r.Shard] = s
			}
			if r.RaftState == "Leader" {
				s.Leaders = append(s.Leaders, n.id)
				s.Voters, s.Nonvoters = slices.Sorted(slices.Values(r.Voters)), slices.Sorted(slices.Values(r.Nonvoters))
				members[r.Shard] = append(slices.Clone(r.Voters), r.Nonvoters...)
			}
			s.Replicas = append(s.Replicas, checker.ReplicaState{Node: n.id, AppliedIndex: r.DigestIndex, Digest: r.Digest})
		}
	}
	for id, s := range byShard {
		// A replica that left the configuration is released lazily; only
		// the configuration's members must agree.
		if m, ok := members[id]; ok {
			s.Replicas = slices.DeleteFunc(s.Replicas, func(r checker.ReplicaState) bool { return !slices.Contains(m, r.Node) })
		}
		out.Shards = append(out.Shards, *s)
	}
	slices.SortFunc(out.Shards, func(a, b checker.ShardState) int { return int(a.ID) - int(b.ID) })
	return out
}

func summary(r checker.Results) string {
	verdict := "VALID"
	if !r.Valid {
		verdict = "INVALID"
	}
	b := r.Ops[checker.FBackup]
	u := r.Ops[checker.FUpdate]
	rc := r.Ops[checker.FRecurring]
	tp := r.Ops[checker.FTenantProbe]
	return fmt.Sprintf("%s: lost=%d early=%d (under skew %d) cancel_violations=%d phantom=%d idempotency_violations=%d expired_early=%d resurrected=%d duplicates=%d (refired %d, retried %d) converged=%v crashes=%d format_refusals=%d disk_exits=%d firing_orphans=%d\n"+
		"updates: %d ok, %d failed, %d unknown; update_violations=%d stale_reads=%d\n"+
		"lists: %s; bulk cancels: %s; bulk_cancel_violations=%d\n"+
		"recurring: %d ops ok, %d failed, %d unknown; %d occurrences; recurring_missing=%d recurring_early=%d recurring_phantom=%d recurring_after_stop=%d recurring_trigger_lost=%d recurring_trigger_early=%d recurring_backfill_lost=%d recurring_backfill_outside=%d\n"+
		"bursts: %d checked, %d skipped (a fault overlapped them, or nothing of them was acked or read back); priority_violations=%d\n"+
		"tenants: %d probes refused, %d let through, %d unanswered; tenant_violations=%d\n"+
		"ingest: %s; ingest_lost=%d ingest_after_tombstone=%d ingest_after_replace=%d ingest_rejected=%d\n"+
		"backups: %d ok, %d failed; backup_lost=%d backup_phantom=%d backup_wrong_state=%d backup_invalid=%d",
		verdict, r.Lost, r.Early, r.EarlyUnderSkew, r.CancelViolations, r.Phantom, r.IdempotencyViolations, r.ExpiredEarly, r.Resurrected, r.Duplicates, r.DuplicatesByStep["refired"], r.DuplicatesByStep["retried"], r.Converged, r.Crashes, r.FormatRefusals, r.DiskExits, r.FiringOrphans,
		u[checker.TypeOK], u[checker.TypeFail], u[checker.TypeInfo], r.UpdateViolations, r.StaleReads,
		r.ListSummary(), r.BulkCancelSummary(), r.BulkCancelViolations,
		rc[checker.TypeOK], rc[checker.TypeFail], rc[checker.TypeInfo], r.Occurrences, r.RecurringMissing, r.RecurringEarly, r.RecurringPhantom, r.RecurringAfterStop,
		r.RecurringTriggerLost, r.RecurringTriggerEarly, r.RecurringBackfillLost, r.RecurringBackfillOutside,
		r.BurstsChecked, r.BurstsSkipped, r.PriorityViolations,
		tp[checker.TypeFail], tp[checker.TypeOK], tp[checker.TypeInfo], r.TenantViolations,
		r.IngestSummary(), r.IngestLost, r.IngestAfterTombstone, r.IngestAfterReplace, r.IngestRejected,
		b[checker.TypeOK], b[checker.TypeFail]+b[checker.TypeInfo], r.BackupLost, r.BackupPhantom, r.BackupWrongState, r.BackupInvalid)
}
