package checker

import (
	"regexp"
	"time"
)

// Op is one client operation or one nemesis fault window, as the driver recorded it. Times
// are Unix nanoseconds on the driver's single clock.
type Op struct {
	Index   int    `json:"index"`
	Process int    `json:"process"`
	F       string `json:"f"`              // "schedule", "cancel", "get", "update", "list", "cancel_matching", "recurring", "ingest", "invalid", "backup", "nemesis", ...
	Node    string `json:"node,omitempty"` // node the request was sent to

	ID          string `json:"id,omitempty"`
	Topic       string `json:"topic,omitempty"`
	Payload     string `json:"payload,omitempty"`
	DelayNs     int64  `json:"delay_ns,omitempty"`      // schedule: exactly one of DelayNs and DeliverAtNs is set
	DeliverAtNs int64  `json:"deliver_at_ns,omitempty"` // (update: its new due time, the same way)

	// Schedule (and upsert) only: the firing policy it sent. Priority is Event.priority as
	// the request carried it, nil when unset (the server then uses DefaultPriority; JSON
	// omits it, so a history from before priorities reads as unset); see EffectivePriority.
	// WindowNs is Event.window (0: none): the event may fire anywhere in [due, due+window].
	Priority *uint32 `json:"priority,omitempty"`
	WindowNs int64   `json:"window_ns,omitempty"`
	// Burst: the burst the event belongs to, "" for any other (check 12). A burst is
	// scheduled at once on one shard, every event of it due at the same time, on a topic
	// whose rate limit makes it drain over seconds.
	Burst string `json:"burst,omitempty"`

	// Update only: the expected_version it sent (0: none). Payload is the new payload it
	// set; every update of a run sets a payload no other op used. Upsert: the update was a
	// Schedule with on_conflict REPLACE (of an id scheduled less than half the retention
	// before, and never cancelled), which replaces every field and renews a settled event.
	ExpectedVersion uint64 `json:"expected_version,omitempty"`
	Upsert          bool   `json:"upsert,omitempty"`

	InvokeNs   int64 `json:"invoke_ns"`
	CompleteNs int64 `json:"complete_ns"`

	// Type is "ok", "fail" (definitely did not happen) or "info" (unknown: timed out, or
	// the connection was lost after sending).
	Type  string `json:"type"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"` // gRPC code as Go names it (codes.Code.String), e.g. "AlreadyExists"

	AckDueNs int64  `json:"ack_due_ns,omitempty"` // schedule ok: the due time the server returned
	Existing bool   `json:"existing,omitempty"`   // schedule ok: the id already existed with this content
	State    string `json:"state,omitempty"`      // get ok: scheduled/fired/cancelled/dead_lettered
	// Version: get ok, the event's version; update ok, the version it made (AckDueNs is
	// then its due time).
	Version uint64 `json:"version,omitempty"`

	// List and cancel_matching only: the filter's id_prefix (the workload selects by prefix,
	// and a list sometimes by state too).
	Prefix string `json:"prefix,omitempty"`
	// List only. States: the filter's states, named as Get's are (empty: every state).
	// Listed: for an ok list, every entry of every page, in order (nothing for one that is
	// not ok). Pages: how many pages it read. More: it stopped with a page still to come, so
	// Listed is not the whole answer.
	States []string `json:"states,omitempty"`
	Listed []Listed `json:"listed,omitempty"`
	Pages  int      `json:"pages,omitempty"`
	More   bool     `json:"more,omitempty"`

	// Cancel_matching only: whether it was a dry run, and the totals of the last progress
	// message it received (for an ok one, the message with done=true).
	DryRun       bool   `json:"dry_run,omitempty"`
	Matched      uint64 `json:"matched,omitempty"`
	Cancelled    uint64 `json:"cancelled,omitempty"`
	SkippedFired uint64 `json:"skipped_fired,omitempty"`
	SkippedHeld  uint64 `json:"skipped_held,omitempty"`

	// Backup only. Type is ok when the backup wrote its manifest, fail when it did not. Dir
	// is its directory, relative to the run's folder; Node the node asked (it relays the
	// shards it does not lead). The driver reads the directory back once the op completes:
	// BackupShards is what an ok backup's manifest lists, BackupEvents every event its shard
	// files hold (id → state, named as Get's states are), BackupReadError why an ok backup
	// did not read back (manifest, sizes, SHA-256s or streams), and LeftManifest that a
	// failed one left a manifest.json all the same.
	Dir             string            `json:"dir,omitempty"`
	BackupShards    []BackupShard     `json:"backup_shards,omitempty"`
	BackupEvents    map[string]string `json:"backup_events,omitempty"`
	BackupReadError string            `json:"backup_read_error,omitempty"`
	LeftManifest    bool              `json:"left_manifest,omitempty"`

	// Recurring only: Action is create, pause, resume or delete; ID the schedule's id; Topic
	// and Payload its target. A create also holds the rule: Cron ("*/k * * * * *", every k
	// seconds of the minute) or EveryNs (from StartNs), the zone, and StartNs and EndNs
	// (0: none), and its catch-up.
	Action   string `json:"action,omitempty"`
	Cron     string `json:"cron,omitempty"`
	EveryNs  int64  `json:"every_ns,omitempty"`
	TimeZone string `json:"time_zone,omitempty"`
	StartNs  int64  `json:"start_ns,omitempty"`
	EndNs    int64  `json:"end_ns,omitempty"`
	CatchUp  string `json:"catch_up,omitempty"` // skip, last or all
	// Trigger: AtNs is the occurrence time it sent (the server keeps its millisecond), and
	// Existing, for an ok one, that the answer said the occurrence existed already.
	// Backfill: FromNs and ToNs bound the nominal times it asked for, [FromNs, ToNs); for an
	// ok one, CreatedNs are the nominal times the answer says it created and
	// BackfillExisting how many it found existing.
	AtNs             int64   `json:"at_ns,omitempty"`
	FromNs           int64   `json:"from_ns,omitempty"`
	ToNs             int64   `json:"to_ns,omitempty"`
	CreatedNs        []int64 `json:"created_ns,omitempty"`
	BackfillExisting int     `json:"backfill_existing,omitempty"`

	// Tenant_probe only (check 13): the credential the probe called with; Action is the call
	// (Probe*), and Error the answer's status message.
	Credential string `json:"credential,omitempty"`

	// Ingest only (check 15): where the broker put an ok ingest op's record. Every record of
	// a key goes to one partition, and Chime applies a partition's records in offset order.
	Partition int32 `json:"partition,omitempty"`
	Offset    int64 `json:"offset,omitempty"`

	// Nemesis only: InvokeNs is the fault's start, CompleteNs its heal.
	Kind    string   `json:"kind,omitempty"`
	Targets []string `json:"targets,omitempty"`
	SkewNs  int64    `json:"skew_ns,omitempty"`
}

// DefaultPriority is the priority of an event whose request left it unset.
const DefaultPriority = 5

// EffectivePriority is the priority the server gives the event op schedules: op.Priority,
// or DefaultPriority when it is unset.
func (op *Op) EffectivePriority() int {
	if op.Priority == nil {
		return DefaultPriority
	}
	return int(*op.Priority)
}

// Op.F values.
const (
	FSchedule = "schedule"
	FCancel   = "cancel"
	FGet      = "get"
	FUpdate   = "update"
	FInvalid  = "invalid"
	FBackup   = "backup"
	FNemesis  = "nemesis"
	// FList is a List by id prefix (Op.Prefix, Op.States, Op.Listed); FCancelMatching a
	// CancelMatching by id prefix (Op.Prefix, Op.DryRun and its totals).
	FList           = "list"
	FCancelMatching = "cancel_matching"
	// FRecurring creates, pauses, resumes, deletes, triggers or backfills a recurring
	// schedule (Op.Action).
	FRecurring = "recurring"
)

// Op.Action values of a recurring op.
const (
	ActionCreate = "create"
	ActionPause  = "pause"
	ActionResume = "resume"
	ActionDelete = "delete"
	// ActionTrigger makes one extra occurrence at Op.AtNs; ActionBackfill the rule's
	// occurrences in [Op.FromNs, Op.ToNs) that have none.
	ActionTrigger  = "trigger"
	ActionBackfill = "backfill"
)

// Listed is one entry of a list op: an event as List showed it.
type Listed struct {
	ID      string `json:"id"`
	State   string `json:"state"`             // named as Op.State
	Version uint64 `json:"version,omitempty"` // 0: not reported
	DueNs   int64  `json:"due_ns,omitempty"`
}

// Event states as Op.State and Op.BackupEvents name them.
const (
	StateScheduled    = "scheduled"
	StateFired        = "fired"
	StateCancelled    = "cancelled"
	StateDeadLettered = "dead_lettered"
)

// BackupShard is one shard of a backup, as its manifest lists it.
type BackupShard struct {
	Shard        uint32 `json:"shard"`
	AppliedIndex uint64 `json:"applied_index"`
	Node         string `json:"node,omitempty"` // the leader the copy came from
	Events       int    `json:"events"`         // events its file holds
}

// Op.Type values.
const (
	TypeOK   = "ok"
	TypeFail = "fail"
	TypeInfo = "info"
)

// CodeNotFound is Op.Code for NOT_FOUND, as codes.NotFound.String() spells it.
const CodeNotFound = "NotFound"

// KindSkew is the nemesis kind that moves node clocks; early records under it are reported
// apart (Results.EarlyUnderSkew).
const KindSkew = "skew"

// Record is one Kafka record as read back after the run by an independent client.
//
// AppendMs is the broker's LogAppendTime. The broker runs in the driver process, so it is the
// driver's clock, at millisecond resolution (truncated). ReceivedNs is when the reader got it.
// DueMs, FiredMs, Attempt and Version are the chime-due-unix-ms, chime-fired-unix-ms,
// chime-attempt and chime-version headers; FiredMs is the firing node's clock, which a skew nemesis moves.
type Record struct {
	ID         string `json:"id"`
	Topic      string `json:"topic"`
	Partition  int32  `json:"partition"`
	Offset     int64  `json:"offset"`
	Payload    string `json:"payload"`
	DueMs      int64  `json:"due_ms"`
	FiredMs    int64  `json:"fired_ms"`
	Attempt    int    `json:"attempt"`
	Version    uint64 `json:"version,omitempty"` // chime-version; 0 when absent (1 is meant)
	AppendMs   int64  `json:"append_ms"`
	ReceivedNs int64  `json:"received_ns"`
	// A recurring schedule's occurrence: the chime-recurring-id and chime-occurrence-unix-ms
	// headers ("" and 0 for any other record).
	RecurringID  string `json:"recurring_id,omitempty"`
	OccurrenceMs int64  `json:"occurrence_ms,omitempty"`
	// Error is the chime-error header of a record on the ingest rejected topic (whose ID the
	// driver sets to <ingest topic>/<key>, as Chime names the id); "" for any other record.
	Error string `json:"error,omitempty"`
}

// Cluster is the final state of the cluster after the last heal and the drain.
type Cluster struct {
	Shards []ShardState `json:"shards"`
	// Replication is the cluster's replication factor; 0 leaves the shards'
	// configurations unchecked (Voters, Live and Removed unread).
	Replication int `json:"replication,omitempty"`
	// Live are the members running at the end; Removed, the nodes the run
	// removed for good. Every shard's voters must be Replication live nodes.
	Live    []string `json:"live,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// Crashes are the times a node's process ended that the nemesis did not end it.
	Crashes []Crash `json:"crashes,omitempty"`
	// Orphans are the lines of the nodes' logs that say a leader found a pending event
	// overdue in no part of its firing and put it back (shard.OrphanMessage).
	Orphans []Orphan `json:"orphans,omitempty"`
}

// Orphan is one line of a node's log saying its firing had lost an event.
type Orphan struct {
	Node string `json:"node"`
	Line string `json:"line"`
}

// Crash is a node's process ending by itself: a panic, a fatal error, an exit.
type Crash struct {
	Node string `json:"node"`
	AtNs int64  `json:"at_ns"`
	Exit string `json:"exit"` // as os/exec says it: "exit status 2"
	// Line is the log's first line that says why ("panic: ...", "fatal error: ..."),
	// or its last line.
	Line string `json:"line"`
	// Build is the chimed the process ran: "old" or "new" in a run with the upgrade
	// nemesis, "" otherwise.
	Build string `json:"build,omitempty"`
}

// refusals are the lines with which a chimed stops because a Raft entry or a stored value
// is in a format it does not know (raftfsm: an entry that cannot be decoded stops the
// node). Only these are a refusal: a malformed entry that is not of an unknown kind, type,
// op, flag or format is a bug of whichever build wrote it.
var refusals = regexp.MustCompile(`^panic: raftfsm: shard \d+: log entry \d+ \(term \d+\) cannot be applied: raftfsm: malformed command: .*unknown (command type|op|flags|fields|catch-up) ` +
	`|^panic: raftfsm: .*unknown (body|status) format \d+`)

// RefusedFormat reports whether c is a node of the old build in an upgrade run stopping
// because the current build wrote something it cannot read: the loud refusal it owes, which
// is not a crash. The same line from the current build is a crash: nothing of the current
// format may be unreadable to it.
func RefusedFormat(c Crash) bool {
	return c.Build == "old" && refusals.MatchString(c.Line)
}

// ShardState is one shard as every node reported it.
type ShardState struct {
	ID       uint32         `json:"id"`
	Leaders  []string       `json:"leaders"` // every node that claims leadership of the shard
	Replicas []ReplicaState `json:"replicas"`
	// Voters and Nonvoters are the shard's Raft configuration as its leader
	// reported it.
	Voters    []string `json:"voters,omitempty"`
	Nonvoters []string `json:"nonvoters,omitempty"`
}

// ReplicaState is one replica's applied index and state digest.
type ReplicaState struct {
	Node         string `json:"node"`
	AppliedIndex uint64 `json:"applied_index"`
	Digest       string `json:"digest"`
}

// Config holds the tolerances of the checks. Zero fields take the defaults below; a negative
// EarlyTolerance, DuplicateGrace or PriorityTolerance means zero.
type Config struct {
	// EarlyTolerance: a record is early only if it was appended more than this before its
	// due time. Default 2 ms: AppendMs is truncated to the millisecond (up to 1 ms lost) and
	// a due time taken from the chime-due-unix-ms header is truncated too (another 1 ms).
	EarlyTolerance time.Duration
	// CancelTolerance: a record appended up to this long after a Cancel's ack is not a
	// violation. Default 0: AppendMs is truncated, so AppendMs*1e6 > ack already proves the
	// append happened after the ack.
	CancelTolerance time.Duration
	// DuplicateGrace: a duplicate appended up to this long after a fault's heal is
	// attributed to that fault. Default 10 s (leader elections, Raft catch-up and produce
	// retries with backoff up to 5 s settle within it).
	DuplicateGrace time.Duration
	// FinalHealNs is the end of the last fault: events due after it are in the after_heal
	// period. Zero means the latest heal among the nemesis ops.
	FinalHealNs int64
	// DeadLetterTopic is the topic of dead-lettered copies (default "chime.deadletter",
	// publish.DefaultDeadLetterTopic). Their topic is not compared with the scheduled
	// topic (the dead-letter record's chime-topic header is not part of Record).
	DeadLetterTopic string
	// Retention is the cluster's --retention: a settled event may be removed this long after
	// it settled, and not before. Zero means settled events are kept forever.
	Retention time.Duration
	// PriorityTolerance: within a burst, a lower-priority event appended up to this long
	// before a higher-priority one is no priority violation (check 12). Default 500 ms: the
	// leader reserves rate-limit slots up to about 250 ms ahead, and produces batches
	// concurrently, so neighbouring priorities overlap by that much.
	PriorityTolerance time.Duration
	// IngestBound: how long after the broker acknowledged an ingest record Chime may still be
	// applying it, outside fault windows (check 15 (c)). Default DefaultIngestBound (15 s).
	IngestBound time.Duration
	// IngestRejectedTopic is where Chime puts the ingest records it cannot apply (default
	// DefaultIngestRejectedTopic); their copies are judged by check 15 (d).
	IngestRejectedTopic string
}

// Defaults of Config.
const (
	DefaultEarlyTolerance    = 2 * time.Millisecond
	DefaultDuplicateGrace    = 10 * time.Second
	DefaultDeadLetterTopic   = "chime.deadletter"
	DefaultPriorityTolerance = 500 * time.Millisecond
)

func (c Config) withDefaults(ops []Op) Config {
	if c.EarlyTolerance == 0 {
		c.EarlyTolerance = DefaultEarlyTolerance
	} else if c.EarlyTolerance < 0 {
		c.EarlyTolerance = 0
	}
	if c.CancelTolerance < 0 {
		c.CancelTolerance = 0
	}
	if c.DuplicateGrace == 0 {
		c.DuplicateGrace = DefaultDuplicateGrace
	} else if c.DuplicateGrace < 0 {
		c.DuplicateGrace = 0
	}
	if c.PriorityTolerance == 0 {
		c.PriorityTolerance = DefaultPriorityTolerance
	} else if c.PriorityTolerance < 0 {
		c.PriorityTolerance = 0
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = DefaultDeadLetterTopic
	}
	if c.IngestBound <= 0 {
		c.IngestBound = DefaultIngestBound
	}
	if c.IngestRejectedTopic == "" {
		c.IngestRejectedTopic = DefaultIngestRejectedTopic
	}
	if c.FinalHealNs == 0 {
		for _, op := range ops {
			if op.F == FNemesis && op.CompleteNs > c.FinalHealNs {
				c.FinalHealNs = op.CompleteNs
			}
		}
	}
	return c
}

// Results is what Check found. It is written as results.json.
type Results struct {
	// Valid: Lost, Early, CancelViolations, Phantom, IdempotencyViolations, ExpiredEarly,
	// Resurrected, the four Backup counts, UpdateViolations, StaleReads,
	// BulkCancelViolations, the eight Recurring counts, PriorityViolations,
	// TenantViolations, the four Ingest counts and Crashes are all zero and the final state
	// converged.
	Valid bool `json:"valid"`

	Lost                  int `json:"lost"`                   // ids
	Early                 int `json:"early"`                  // records
	EarlyUnderSkew        int `json:"early_under_skew"`       // records, not in Early
	CancelViolations      int `json:"cancel_violations"`      // records
	Phantom               int `json:"phantom"`                // records
	IdempotencyViolations int `json:"idempotency_violations"` // ids
	ExpiredEarly          int `json:"expired_early"`          // get ops
	Resurrected           int `json:"resurrected"`            // ids
	BackupLost            int `json:"backup_lost"`            // (backup, id) pairs
	BackupPhantom         int `json:"backup_phantom"`         // (backup, id) pairs
	BackupWrongState      int `json:"backup_wrong_state"`     // (backup, id) pairs
	BackupInvalid         int `json:"backup_invalid"`         // backup ops
	UpdateViolations      int `json:"update_violations"`      // findings
	StaleReads            int `json:"stale_reads"`            // get ops and (list op, id) pairs
	BulkCancelViolations  int `json:"bulk_cancel_violations"` // records and cancel_matching ops
	RecurringMissing      int `json:"recurring_missing"`      // occurrences
	RecurringEarly        int `json:"recurring_early"`        // records
	RecurringPhantom      int `json:"recurring_phantom"`      // records
	RecurringAfterStop    int `json:"recurring_after_stop"`   // occurrences
	// Trigger and Backfill of recurring schedules.
	RecurringTriggerLost     int `json:"recurring_trigger_lost"`     // trigger ops
	RecurringTriggerEarly    int `json:"recurring_trigger_early"`    // records
	RecurringBackfillLost    int `json:"recurring_backfill_lost"`    // occurrences
	RecurringBackfillOutside int `json:"recurring_backfill_outside"` // records
	PriorityViolations       int `json:"priority_violations"`        // (lower, higher) pairs within a burst
	TenantViolations         int `json:"tenant_violations"`          // tenant_probe ops and records
	IngestLost               int `json:"ingest_lost"`                // ingest ids
	IngestAfterTombstone     int `json:"ingest_after_tombstone"`     // records
	IngestAfterReplace       int `json:"ingest_after_replace"`       // records
	IngestRejected           int `json:"ingest_rejected"`            // records on the rejected topic

	// Ingest counts the ingest ops by action and type, and the ids they named (measured).
	Ingest IngestTotals `json:"ingest"`

	// BurstsChecked and BurstsSkipped count the bursts check 12 judged and those it left
	// out (a fault window overlapped them, or nothing of them was acked or read back);
	// Bursts has one entry per burst, by due time.
	BurstsChecked int           `json:"bursts_checked"`
	BurstsSkipped int           `json:"bursts_skipped"`
	Bursts        []BurstResult `json:"bursts"`

	// Occurrences counts the distinct occurrences read back (measured, not judged).
	Occurrences int `json:"occurrences"`

	// BulkCancels sums the totals of the ok cancel_matching ops that were not dry runs
	// (measured, not judged).
	BulkCancels BulkTotals `json:"bulk_cancels"`

	Duplicates        int            `json:"duplicates"`          // extra copies
	DuplicatesByFault map[string]int `json:"duplicates_by_fault"` // nemesis kind or "none" → extra copies
	// DuplicatesByStep: which step of the fire path made each copy, read from its
	// chime-attempt header against the first copy's. "refired": the same attempt number, so
	// the event was taken from the shard's state again, its MarkFired never having committed
	// (a new leader, or its leader after a failed mark); "retried": a later attempt, so a
	// produce its leader could not confirm was sent again, and the first had landed.
	DuplicatesByStep map[string]int `json:"duplicates_by_step"`

	Converged           bool     `json:"converged"`
	ConvergenceProblems []string `json:"convergence_problems"`

	// Crashes counts the node processes that ended without the nemesis ending them, but
	// for the old build's refusals (RefusedFormat) and DiskExits.
	Crashes int `json:"crashes"`
	// FormatRefusals counts the old build's processes that stopped refusing data the
	// current build wrote (RefusedFormat): measured, not judged.
	FormatRefusals int `json:"format_refusals"`
	// DiskExits counts the node processes that stopped because a disk fault on them left
	// their data directory unwritable, as chimed must (check 14; measured, not judged).
	DiskExits int `json:"disk_exits"`
	// FiringOrphans counts the events a leader's firing had lost and its sweep put back,
	// late by seconds (Cluster.Orphans): a bug, measured, not judged, since the event
	// still fired and was never early; lost or late records are judged by the other checks.
	FiringOrphans int `json:"firing_orphans"`

	LatenessMs Lateness   `json:"lateness_ms"`
	Recovery   []Recovery `json:"recovery"`

	// InvalidAccepted counts "invalid" ops (deliberately bad input) that returned ok
	// (design invariant 7). Reported, not part of Valid.
	InvalidAccepted int `json:"invalid_accepted"`

	Ops               map[string]map[string]int `json:"ops"` // f → type → count
	AckedIDs          int                       `json:"acked_ids"`
	DeliveredIDs      int                       `json:"delivered_ids"`
	Records           int                       `json:"records"`
	DeadLetterRecords int                       `json:"dead_letter_records"`

	// Examples: check name (the JSON key of its count) → up to MaxExamples findings.
	Examples map[string][]Example `json:"examples"`

	Config ConfigUsed `json:"config"`
}

// BulkTotals sums the progress totals of bulk cancels.
type BulkTotals struct {
	Ops          int    `json:"ops"`
	Matched      uint64 `json:"matched"`
	Cancelled    uint64 `json:"cancelled"`
	SkippedFired uint64 `json:"skipped_fired"`
	SkippedHeld  uint64 `json:"skipped_held"`
}

// IngestTotals counts what went through the ingest topic (check 15).
type IngestTotals struct {
	IDs        int `json:"ids"`
	Schedules  int `json:"schedules"`  // acknowledged by the broker
	Tombstones int `json:"tombstones"` // acknowledged by the broker
	Unknown    int `json:"unknown"`    // info: the broker's answer was lost
	Fired      int `json:"fired"`      // ids with at least one fired record
}

// BurstResult is one burst as check 12 saw it.
type BurstResult struct {
	Burst string `json:"burst"`  // Op.Burst
	DueNs int64  `json:"due_ns"` // D: when every event of it fell due
	// Events: the ids of the burst; Judged: those whose record the rule compared.
	Events int `json:"events"`
	Judged int `json:"judged"`
	// LastAppendNs: the last append of a record of the burst (0: none); DrainMs: how long
	// after D that was, in ms (measured, not judged).
	LastAppendNs int64   `json:"last_append_ns"`
	DrainMs      float64 `json:"drain_ms"`
	// Skipped says why the burst was not judged ("" when it was); Violations counts its
	// (lower, higher) pairs.
	Skipped    string `json:"skipped,omitempty"`
	Violations int    `json:"violations"`
}

// MaxExamples bounds Results.Examples per check.
const MaxExamples = 10

// Example is one finding of a check.
type Example struct {
	ID  string `json:"id"`
	Why string `json:"why"`
}

// Lateness is the lateness distribution per period of the run.
type Lateness struct {
	Healthy   Quantiles `json:"healthy"`
	Faulty    Quantiles `json:"faulty"`
	AfterHeal Quantiles `json:"after_heal"`
}

// Quantiles summarises lateness values in milliseconds (nearest-rank quantiles).
type Quantiles struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// Recovery is how long after one fault's heal the backlog took to reach Kafka.
type Recovery struct {
	Kind       string   `json:"kind"`
	Targets    []string `json:"targets"`
	StartNs    int64    `json:"start_ns"`
	HealNs     int64    `json:"heal_ns"`
	RecoveryMs float64  `json:"recovery_ms"`
}

// ConfigUsed is the Config Check ran with, defaults applied.
type ConfigUsed struct {
	EarlyToleranceNs    int64  `json:"early_tolerance_ns"`
	CancelToleranceNs   int64  `json:"cancel_tolerance_ns"`
	DuplicateGraceNs    int64  `json:"duplicate_grace_ns"`
	FinalHealNs         int64  `json:"final_heal_ns"`
	DeadLetterTopic     string `json:"dead_letter_topic"`
	RetentionNs         int64  `json:"retention_ns"`
	PriorityToleranceNs int64  `json:"priority_tolerance_ns"`
	IngestBoundNs       int64  `json:"ingest_bound_ns"`
	IngestRejectedTopic string `json:"ingest_rejected_topic"`
}
