// Package checker decides whether a chime-jepsen run kept Chime's invariants, measures what
// the faults cost (duplicates, lateness, recovery), and writes the run's report.
//
// # What it owns and what it must never do
//
// It owns the meaning of a run's files: the history (one [Op] per client operation, backup or
// fault window), the records read back from Kafka (one [Record] each), the final cluster state
// ([Cluster]), the rules below, results.json and report.html. The driver (package main of
// cmd/chime-jepsen) produces the inputs; this package only reads them.
//
// It is pure: no network, no clock, no randomness. [Check] is a function of its arguments,
// so a stored run can be re-checked, and tests feed it synthetic histories. It never trusts
// what the system under test says about itself where the history can decide: due times come
// from acked Schedule responses when there are some, not from the record headers.
//
// # Times
//
// Op times are Unix nanoseconds on the driver's single clock. Record.AppendMs is the broker's
// LogAppendTime; the broker runs in the driver process, so it is the same clock, truncated to
// the millisecond: the real append happened in [AppendMs, AppendMs+1ms). Below, "append" is
// AppendMs×1e6 ns. FiredMs is the firing node's clock (moved by a skew nemesis) and is not
// used by any check.
//
// The due time of a record is, for the event's first version (a record whose chime-version
// header is 1 or absent), the AckDueNs of its id's reference ok schedule (below) when an ok
// schedule of the id carried one; for a later version v, the AckDueNs of the ok update that
// made v (Op.Version == v); else the record's chime-due-unix-ms header × 1e6. Records of a
// version after the first are phantoms unless an ok or info update of the id set their
// payload (and a schedule that may have been stored, their topic: an update keeps it); their
// payloads are compared with each other only within one version (check 5).
//
// Schedule and cancel ops are indexed by Op.ID; one without an id is ignored, so a record
// without a chime-id header (ID "") is a phantom. Ids a backup holds are indexed too, so an id
// only a backup knows is checked (check 7).
//
// # Lists and bulk cancels
//
// A list op (F "list") is a List by id prefix (Op.Prefix), sometimes filtered by state
// (Op.States), which read Op.Pages pages; an ok one holds every entry it showed
// (Op.Listed), More set when it stopped with a page still to come. Each entry of an ok list
// is a read of its id, as an ok get is (check 9); a failed or unknown list shows nothing. Each
// ok list is also indexed under every id its prefix matches (ids sort, so those are one
// range), whether or not it showed it.
//
// A cancel_matching op is a CancelMatching by id prefix: Op.DryRun, and the totals of the
// last progress message it received (Matched, Cancelled, SkippedFired, SkippedHeld); ok only
// when the last message (done) came; fail only when refused (INVALID_ARGUMENT, before any
// step: any other error may follow committed steps, so it is info). It is judged through the
// cancels it stands for: for each id its prefix matches that some ok or info schedule may have
// stored, a cancel op is synthesized, with the bulk op's invocation, completion and index,
// and counted as one of the id's cancels by every check below (lost, cancel_violations,
// expired_early's settle, resurrected, backup_wrong_state, update_violations (c), stale
// reads):
//   - none for a dry run or a failed bulk op;
//   - an ok bulk op finished its steps before it completed, so it stands for a cancel only of
//     the ids an ok or info schedule of which was invoked before it completed; an info one,
//     whose steps may still commit after the client gave up, of every id it matches;
//   - the cancel is ok when the bulk op certainly cancelled the event: it is ok, no dry run,
//     and reported skipped_held == 0 and skipped_fired == 0 (every pending event it matched,
//     it cancelled); an ok schedule of the id completed before it was invoked (its steps,
//     linearizable, saw the event); no record of the id was appended by its completion
//     (append ≤ C; otherwise the event may have fired before a step reached it, unmatched, and
//     a later stray copy is no broken promise, as after a Cancel refused because the event
//     fired); the id never had an ok or info upsert (which renews a settled event); and no ok
//     or info update of it may have taken effect while it ran (invoked before its completion,
//     unless ok and completed before its invocation: an update moves the event in the due
//     order the steps walk, possibly behind a step's position). Otherwise the cancel is info.
//
// The driver gives upsertable ids a shape of their own ("u…", the others "e…"), so that no
// prefix it takes from an "e" id matches one.
//
// A fault window is a nemesis op: [InvokeNs, CompleteNs] = [start, heal]. A window whose heal
// is before its start (never healed) lasts to the latest time seen in the run.
//
// # The checks that decide validity
//
// valid = lost == 0 && early == 0 && cancel_violations == 0 && phantom == 0 &&
// idempotency_violations == 0 && expired_early == 0 && resurrected == 0 && backup_lost == 0 &&
// backup_phantom == 0 && backup_wrong_state == 0 && backup_invalid == 0 &&
// update_violations == 0 && stale_reads == 0 && bulk_cancel_violations == 0 &&
// recurring_missing == 0 && recurring_early == 0 && recurring_phantom == 0 &&
// recurring_after_stop == 0 && recurring_trigger_lost == 0 && recurring_trigger_early == 0 &&
// recurring_backfill_lost == 0 && recurring_backfill_outside == 0 &&
// priority_violations == 0 && tenant_violations == 0 &&
// ingest_lost == 0 && ingest_after_tombstone == 0 && ingest_after_replace == 0 &&
// ingest_rejected == 0 && crashes == 0 && converged. (Check 15's early, phantom and
// backup_phantom findings count in early, phantom and backup_phantom.)
//
//  1. lost (counts ids; design invariant 3). An id with at least one schedule op of type ok
//     (existing or not) and no cancel op of type ok or info (a bulk cancel's synthesized
//     cancel included: an id a bulk cancel may have cancelled need not fire) must have at
//     least one record,
//     on any topic (a copy on the dead-letter topic counts: dead-lettering is an outcome the
//     design allows). An info schedule alone makes no demand: it may never have happened. A
//     failed cancel (FAILED_PRECONDITION, NOT_FOUND, ...) excuses nothing. The driver must
//     read Kafka only after every acked event is due and the cluster has drained.
//
//  2. early (counts records; invariant 2). A record is early when append < due −
//     EarlyTolerance. The default tolerance, 2 ms, covers the truncation of AppendMs (< 1 ms)
//     and of the header due when it is the one used (< 1 ms); nodes and broker share one
//     kernel clock, so nothing else needs room. Strict "<": a record appended exactly
//     EarlyTolerance before due is not early.
//
//     early_under_skew (counts records, not in early, not in valid) takes the early records
//     that a skew window can explain: its due lies in [start, heal] or its append in
//     [start, heal + 1 s] of a window of kind "skew" (a clock set ahead fires while the skew
//     is in place, the event it fires may be due after the heal, and a produce in flight at
//     the heal is appended after it), and, when the window's SkewNs is non-zero, the clock
//     moved ahead (SkewNs > 0: chimed's fault clock reads real time + offset) and the record
//     is early by at most SkewNs + EarlyTolerance (a clock moved ahead by s cannot fire more
//     than s early; one moved back fires late, never early). SkewNs == 0 means the magnitude
//     is unknown: any early record the window contains counts as under skew. Chime's leader
//     fires by its own clock, so a clock moved ahead fires early; the report shows how often
//     without calling it a bug.
//
//  3. cancel_violations (counts records; invariant 4). For an id with a cancel op of type ok,
//     take the earliest such ack, completed at C. Every record of the id with append > C +
//     CancelTolerance is a violation. The default tolerance is 0 because AppendMs is
//     truncated: append > C already proves the real append followed the ack, while a record
//     in the ack's own millisecond gets the benefit of the doubt. Records appended before the
//     ack are allowed: the produce may race the cancel, and the invariant only forbids
//     production after the ack. When that earliest ok cancel is one synthesized from a bulk
//     cancel, its violations are counted in bulk_cancel_violations (check 10), not here.
//
//  4. phantom (counts records). A record is a phantom when no schedule op of type ok or info
//     ever carried its id, or when its (topic, payload) matches none of the id's candidate
//     contents. The candidates are the contents of the id's ok schedules if it has any (an ok
//     says the stored content is its own: it created it, or existing=true means identical),
//     else the contents of its info schedules (any one may be the stored one). A failed
//     schedule never stored anything: a re-send that failed with ALREADY_EXISTS (or any other
//     code) is never the stored content. Records on the dead-letter topic are matched on
//     payload only; their topic is the dead-letter topic.
//
//  5. idempotency_violations (counts ids; invariant 6). Content is what the server's content
//     hash covers and the history holds: topic, payload, and the due as the client gave it
//     (delay_ns or deliver_at_ns). An id violates idempotency when any of these holds:
//     (a) two or more ok schedules returned existing=false (both claim to have created it);
//     (b) ok schedules with identical content returned different non-zero AckDueNs;
//     (c) its ok schedules carry different contents (an existing=true whose content differs
//     from the first accepted content: the first creator by invoke time, else the first ok
//     by completion time);
//     (d) its non-phantom records carry different payloads, or (dead-letter copies aside)
//     different topics: two events were stored under one id. Phantom records are left to
//     check 4, so one wrong record is reported once.
//     One example per id lists every clause that holds.
//     An ok with existing=true for a client's first send of an id is not a violation: when a
//     request meets a leader change, the server retries it for the client, and a retry after
//     an attempt whose outcome was unknown finds the attempt's own event ("already scheduled
//     with identical content"), which is what existing=true says.
//
//  6. expired_early (counts get ops) and resurrected (counts ids): retention. Config.Retention
//     is the cluster's; zero means settled events are kept forever. An event is acked for a
//     get when an ok schedule of its id completed before the get was invoked; it settled no
//     earlier than its first record's append or the invocation of its first ok or info
//     cancel. A get of an acked id that failed NOT_FOUND is expired_early when the event had
//     not settled by the get's completion, when the retention is off, or when the get
//     completed less than Retention − allowance after the settle, where allowance is the
//     largest |SkewNs| of the skew windows overlapping [settle, completion] (the leader's
//     clock decides both when an event settled and when it expires; a window whose skew is
//     not recorded excuses the get). An id is resurrected when a get finds it (ok) after an
//     earlier get of the acked id found nothing, unless a schedule may have created it anew:
//     an info schedule of the id, or an ok one that completed after the get that found
//     nothing was invoked. The driver re-sends an id only within half the retention after
//     its first send, so no re-send meets an expired event.
//
//  7. backup_lost, backup_phantom, backup_wrong_state (count (backup, id) pairs) and
//     backup_invalid (counts backup ops). A backup op is ok when the backup wrote its
//     manifest, fail when it did not; the driver then reads its directory back (manifest,
//     each file's size and SHA-256, each shard's stream through raftfsm.ForEachSnapshotEvent)
//     into BackupShards and BackupEvents (id → state). Each shard is copied by its leader at
//     one moment between the op's invocation I and completion C, after a Raft barrier, so it
//     holds every event acknowledged before I, and nothing that happened after C.
//     backup_invalid: an ok backup that did not read back (BackupReadError) or lists no
//     shards, or a failed one that left a manifest.json (LeftManifest): a backup that fails
//     must fail cleanly. The other three look only at ok backups that read back:
//     (a) backup_lost: an id with an ok schedule that completed before I is not held,
//     although its event cannot have expired by C (as for expired_early: it had not settled
//     by C, or the retention is off, or it settled less than Retention − allowance before
//     C);
//     (b) backup_phantom: a held id that no ok or info schedule invoked before C carried
//     (never sent, first sent after the backup, only failed or invalid requests);
//     (c) backup_wrong_state: a held id (not a phantom) in a state the history rules out:
//     scheduled although an ok cancel of it completed before I; cancelled although no ok or
//     info cancel of it was invoked before C; fired although no record of it reached its
//     own topic by C (append ≤ C: a leader marks an event fired only once Kafka acknowledged
//     it), dead_lettered likewise with the dead-letter topic; or no state at all. Settled
//     states are allowed whenever the settle may have happened by C, pending whenever it
//     may not have happened by I. The applied index of each shard is recorded, not judged.
//     A backup's occurrences of recurring schedules (ids <schedule>@<digits> of a schedule
//     an ok or info create made) are left to check 11, which judges them by their records.
//
//  9. update_violations (counts findings) and stale_reads (count get ops and (list op, id)
//     pairs). For every ok
//     update U of an id, to version v, completed at C: (a) a record of the id of a version
//     below v appended after C is a violation (the update promised that no record of a
//     replaced version follows its ack); (b) a record of version v must carry U's payload.
//     (c) Unless a cancel of the id may have happened (ok or info), some record of the
//     latest version an ok update made, or a later one, must exist; an id with an ok update
//     is judged by (c), not by lost. A re-send of the id's schedule after an update reports
//     the event's due time as it now is, so check 5 does not compare the due times of an
//     updated id's re-sends. ABORTED updates changed nothing (the driver records them as
//     fail); UNKNOWN ones may have (info).
//
//     stale_reads: a List or Get never shows a state older than an acknowledged change that
//     completed before it began. A read is an ok get, or one entry of an ok list; its op is
//     the get or the list, invoked at I and completed at C. A read is stale when
//     (a) it reports a version (0 is a run from before versions) below that of an ok update
//     of its id that completed before I;
//     (b) it shows the event scheduled although an ok cancel of it completed before I (a
//     bulk cancel's synthesized ok cancel included: it certainly cancelled the event), unless
//     an ok or info upsert of the id, which renews a settled event, was invoked before C;
//     (c) it is an entry of a list filtered by states, in a state the filter does not name.
//     And a list leaves an id out (one finding per list and id) when the list is ok, has no
//     states filter and read to its end (not More: a filtered or unfinished list says nothing
//     of what it left out), its prefix matches the id, it did not show it, and it had to: an
//     ok schedule of the id completed before I; no cancel of it that may have happened (ok or
//     info, real or synthesized; a failed one changed nothing) and no ok or info upsert of it
//     was invoked before C; the retention cannot have removed it by C (as for expired_early:
//     it had not settled by C, or the retention is off, or it settled less than Retention −
//     allowance before C); and, for a list of more than one page, no ok or info update of it
//     may have taken effect while the list ran (a page token resumes at a position in the due
//     order, and an update can move an event behind it).
//
//  8. converged. The final state must list at least one shard; every shard must have exactly
//     one distinct node in Leaders, that leader must be one of its replicas, it must have
//     replicas, all replicas must have the same AppliedIndex, and replicas at the same
//     AppliedIndex must have the same Digest (digests at different indexes are expected to
//     differ, so an index mismatch is reported once, as an index mismatch). Each failure is
//     one line of convergence_problems, naming the shard.
//
//  10. bulk_cancel_violations (counts records and cancel_matching ops). (a) Every record of
//     an id appended more than CancelTolerance after the completion of its earliest ok
//     cancel, when that cancel is one synthesized from an ok bulk cancel (it certainly
//     cancelled the event: see "Lists and bulk cancels"); the example names the bulk op's
//     index. (b) A cancel_matching op whose totals contradict each other: a dry run that
//     reports cancelled, skipped_fired or skipped_held non-zero, or any other ok or info one
//     whose matched is not cancelled + skipped_fired + skipped_held (the server keeps that
//     sum in every progress message, so an info op's last totals are judged too); its
//     example is keyed by the prefix and names the op's index. These come first among the
//     examples, in history order.
//
//  11. Recurring schedules (design invariant 9). A record with a chime-recurring-id header
//     (Record.RecurringID, OccurrenceMs) is an occurrence of that schedule: it is judged here
//     and by no check above (no schedule op carries its id). A recurring op (F "recurring")
//     creates, pauses, resumes, deletes, triggers or backfills one (Op.Action). The rule is the first ok or info
//     create's, and the checker computes it by itself: "*/k * * * * *" (k dividing 60)
//     occurs at every Unix second divisible by k, in any zone (every offset is a whole number
//     of minutes, and a transition skips or repeats whole minutes, so the set of instants
//     does not move); an interval occurs at StartNs + n·EveryNs; both within [StartNs,
//     EndNs]. An occurrence's first copy is its earliest append.
//     (a) recurring_phantom (counts records): a record of a schedule no ok or info create
//     made, whose id is not <schedule>@<occurrence ms>, whose occurrence the rule does not
//     generate (or cannot be computed here), or whose topic (dead-letter copies aside) or
//     payload is not the target's.
//     (b) recurring_early (counts records): appended more than EarlyTolerance before its
//     occurrence (the workload sets no jitter); a skew window explains it as for check 2,
//     and it then counts in early_under_skew.
//     (c) recurring_after_stop (counts occurrences): an occurrence first appended more than
//     CancelTolerance after an ok Delete completed, or after an ok Pause completed and before
//     the next Resume (ok or info) was invoked. A copy of an occurrence first appended before
//     the ack is a duplicate, not an occurrence after it.
//     (d) recurring_missing (counts occurrences): for a schedule with an ok create, catch-up
//     all, an end, and no delete that may have happened (ok or info), every occurrence
//     after the create's completion and up to the end has a record; a pause followed by an ok
//     Resume excuses nothing (catch-up all produces what it held back), and one not so
//     followed ends the demand at its invocation. The driver waits for the drain past every
//     schedule's end.
//     A trigger (ok or info) explains the records of its occurrence, at AtNs's millisecond,
//     when the rule does not generate that instant (the workload never triggers at one):
//     they are judged by (e) and the phantom rule's id, topic and payload tests, count as
//     occurrences, and are not the rule's, so (c) and (d) ignore them. A record of a
//     nominal time inside the range of a backfill (ok or info) appended after that backfill
//     was invoked is not after a stop for (c): the backfill made it.
//     (e) recurring_trigger_lost (counts trigger ops): an ok trigger whose answer did not
//     say existing has no record of its occurrence. The triggered event is not the
//     schedule's pending occurrence, so no later pause or delete cancels it.
//     (f) recurring_trigger_early (counts records): a record of a triggered occurrence
//     appended more than EarlyTolerance before the first trigger of that instant was
//     invoked; a skew window explains it as for (b) (early_under_skew).
//     (g) recurring_backfill_lost (counts occurrences): a nominal time an ok backfill's
//     answer lists as created has no record.
//     (h) recurring_backfill_outside (counts records): a record whose nominal time is more
//     than backfillOnlyMargin before the schedule's first create was invoked, which only a
//     backfill can make (the rule's own sequence starts after its creation, on a leader
//     clock the skew nemesis moves by at most 5 s), and that lies in no backfill's (ok or
//     info) [FromNs, ToNs) invoked before it was appended (EarlyTolerance allowed).
//
//  12. priority_violations (counts pairs of events; the firing policy of issue 20: under a
//     backlog, a shard's leader produces the due events of higher priority first). A burst is
//     the schedule ops that carry one Op.Burst: the driver schedules them at once, all on one
//     shard, all due at one time, each with a priority, on a topic whose rate limit makes
//     the shard's leader produce them over seconds, so that at D every one of them is due and
//     waiting. D is the latest due (AckDueNs, else DeliverAtNs) of the burst's ok schedules;
//     A is the latest append of any record of its ids.
//     A burst is skipped (bursts_skipped, with the reason in bursts), not judged, when none
//     of its schedules is ok or no record of its ids was read back (nothing to compare), or
//     when a fault window [start, heal] overlaps [min(D, F), A + 1 s], F the first append
//     of a record of its ids (before D when a leader's clock ran ahead): a leader killed, paused,
//     partitioned, slowed, skewed or cut off from Kafka while the burst drains hands its
//     backlog to another leader, which loads it anew, or produces it in retries and
//     catch-up batches, none of which keeps priority order; the second after A keeps out a
//     fault that began as the drain ended, whose held-back events, when never produced (a
//     loss, check 1), do not move A. Every other burst is checked (bursts_checked).
//     In a checked burst, an id is compared when all of these hold:
//     (i) an ok schedule of it in the burst completed by D: an event stored after D fires
//     at its acceptance, and was not waiting with the others at D (that schedule gives its
//     priority, DefaultPriority when unset);
//     (ii) that schedule set no window: a windowed event fires at a point of its own in
//     [due, due+window], not in priority order;
//     (iii) no cancel or update of it may have happened (ok or info, a bulk cancel's
//     included): either removes the event from the backlog or moves it;
//     (iv) it has exactly one record, on the schedule's topic, with chime-attempt 1
//     (Record.Attempt): a retry's append says when the retry got through, not when the
//     event's turn came; a second copy comes from a leader change or a produce retry, whose
//     first copy's time is not the leader's choice either; a dead-letter copy follows
//     failed attempts. A record without the header (attempt 0) is not compared.
//     A violation is a pair (L, H) of compared ids of one burst with priority(H) >
//     priority(L) and append(L) + PriorityTolerance < append(H): a lower-priority event
//     produced clearly before a higher-priority one that was already due. Strict "<": H
//     appended exactly the tolerance after L is no violation. The default tolerance, 500 ms,
//     covers a leader reserving rate-limit slots up to about 250 ms ahead and producing its
//     batches concurrently, so neighbouring priorities overlap (and the truncation of
//     AppendMs). Events of two bursts (two shards, two leaders) are never compared. One
//     example per L, in burst (D) then append order, names the H of the pair appended last
//     and how many more pairs L is in.
//     The events of bursts are left out of lateness and recovery (below): the rate limit
//     delays them by design. Each burst's drain, A − D, is measured in bursts instead.
//
//  13. tenant_violations (counts tenant_probe ops and records). A tenant_probe op is one
//     call made with a tenant's credential (Op.Credential) on an id outside its scope:
//     another tenant's event (upsert, update, cancel, get), another tenant's recurring
//     schedule (get, pause), or an id nobody has. Its only allowed answers are none (info:
//     unavailable, timed out) and PERMISSION_DENIED with exactly the words of NotPermitted:
//     the same whether or not the id exists, naming neither the event's topic nor its
//     owner. A violation is a probe of type ok (it changed or read what it may not), one
//     refused with another code (NOT_FOUND or ALREADY_EXISTS tell that an id exists) or
//     other words, and a record whose payload begins with ProbePayloadPrefix (a probe's
//     write reached Kafka). A probe whose answer was lost but which took effect shows all
//     the same: an upsert's or update's record carries its payload, and a cancel leaves
//     the owner's event with no record and no cancel of the owner's (lost, 1).
//
//  14. crashes (counts node processes). Every time a node's process ended without the
//     nemesis ending it (Cluster.Crashes) is a crash, with two exceptions, measured, not
//     judged. format_refusals: in an upgrade run a process of the old build (Crash.Build
//     "old") that stops with the line of a Raft entry or stored value of an unknown kind,
//     op, flag or format (RefusedFormat) refused what the current build wrote, loudly, as it
//     must rather than misread it; the same line from the current build, or a malformed
//     entry that is not of an unknown kind, is a crash. disk_exits: a node that stops saying
//     DiskExitLine (its data directory cannot be written, so it hands its shards to
//     replicas on working disks, as chimed must), inside a disk-full or disk-stall window
//     on that node or up to DiskExitGrace (10 s) after its heal (a process whose filesystem
//     is frozen ends only once it thaws); any other line, another node, another kind of
//     window, or a time outside that range is a crash.
//
//  15. firing_orphans (measured, not judged): the lines of the nodes' logs that say a
//     leader found a pending event overdue by seconds in no part of its firing, and put it
//     back to fire (Cluster.Orphans). The event still fired, never early, so no other
//     check fails for it; each line is a bug in the firing path to find.
//
//  15. The ingest topic (docs/ingest.md; design: "a Kafka ingest topic takes the same
//     operations as records"). An ingest op (F "ingest") is one record the driver produced
//     to the ingest topic with its own franz-go client (acks=all, idempotent, the key's
//     partition by hash): Action "schedule" (value Payload, headers chime-topic Topic and
//     chime-delay DelayNs or chime-deliver-at DeliverAtNs in Unix ms) or "tombstone" (null
//     value); ID is the event id Chime gives it, "<ingest topic>/<key>". It is ok when the
//     broker acknowledged it (the produce call returned no error, at CompleteNs), and then Partition
//     and Offset say where it landed; info otherwise (it may have landed); a failed one
//     produced nothing. Every record the driver produces carries a payload of its own, so a
//     fired record names the produced record it came from by its payload. The ids of ingest
//     ops and their records (and every record on Config.IngestRejectedTopic) are judged here
//     and by no check above; a backup's ingest events only by (e). The driver produces one
//     key's records one after the other, never again after an info one.
//
//     What the history cannot see is when Chime applied a record: after the broker appended
//     it (which is after the op's invocation I), in partition order, but possibly long after
//     the ack (a consumer cut off, killed or paused holds its partitions until the fault heals
//     or the group's session timeout, 10 s, moves them). The rules take that into account:
//
//     (a) ingest_lost (counts ids): the id's last ok record (in partition order) is a
//     schedule, and no record fired (any topic; a dead-letter copy counts) with its payload,
//     or with the payload of an info schedule of the key (which may have landed after it);
//     an info tombstone of the key excuses it. A record followed by another ok one of its key
//     is owed nothing: it may have been superseded before it was due. A kafka-cut delays
//     firing, never excuses it: the driver reads Kafka after the drain.
//     (b) early (counts records, in early): a fired record appended more than
//     EarlyTolerance before the earliest due its produced record can have had: its
//     chime-deliver-at, or I + chime-delay. Chime counts the delay from when it accepts the
//     record, which is after the broker appended it, which is after I; not from the ack,
//     which a consumer can overtake, so "ack + delay" would be no bound. A skew window
//     explains it as for check 2 (early_under_skew), and so does, for a chime-delay, a
//     window in which a clock was moved back by at least the earliness and that overlaps
//     [I, append]: the leader counts the delay on its own clock, so a leader s behind
//     gives the event a due s early, which it keeps after the heal. Both together explain
//     it too: a clock moved back by s as the delay was counted, and a skew window that
//     explains the append as for check 2 against the due s earlier.
//     (c) ingest_after_tombstone and ingest_after_replace (count records): a fired record of
//     an ok produced record R, when the next ok record N of its key in the partition (a
//     tombstone, or a schedule that replaces it) was applied before it was appended. Chime
//     applies N only once no record of R's version can still land (a cancel or replace of an
//     event being fired is retried until its produce is settled), so any later copy is a
//     broken promise. N was certainly applied by the earlier of two deadlines:
//     - the ack deadline: N's ack + IngestBound (default 15 s: the session timeout and a
//     rebalance, plus retries), extended while a fault window begins by then to its heal +
//     IngestBound (every kind of fault may hold a consumer or its calls; the extension
//     repeats while windows chain);
//     - the order deadline, first copies only: Chime applies a partition's records in
//     offset order; schedules of distinct keys may go to it in one batch, but a tombstone
//     waits for the batch before it and is done before the records after it are sent. Let T
//     be N when N is a tombstone, else the first ok tombstone after N in the partition (of
//     any key; without one there is no order deadline). Any ok schedule K after T in the
//     partition was accepted after N was applied, and K's first fired copy F was appended
//     after K's acceptance plus its chime-delay; so N was applied by F + 1 ms − max(0, delay
//     − the run's largest |SkewNs|) + EarlyTolerance (F alone for a deliver-at, or when a
//     skew window does not say its size). A later copy of R (a produce attempt that landed
//     late, a duplicate) is held to the ack deadline only.
//     A record appended after the deadline counts in ingest_after_tombstone when N is a
//     tombstone, in ingest_after_replace when N is a schedule; the example names R, N, the
//     deadline and which bound gave it. The driver gives the records a tombstone follows
//     0.5-3 s later a delay of at least 20 s, so that outside faults a tombstone Chime did
//     not apply shows.
//     (d) ingest_rejected (counts records): a record on the rejected topic (its ID, set by
//     the driver, is the chime-source topic / its key; Record.Error its chime-error). The
//     driver produces only valid records, so each is a violation.
//     (e) phantom (in phantom): a fired record of an ingest id whose payload no schedule of
//     the key (ok or info) carried, or that reached another topic than that schedule's
//     (dead-letter copies aside); backup_phantom (in backup_phantom): an ok backup that holds
//     an ingest id no schedule of which was invoked before the backup completed.
//     Duplicates: copies of one produced record beyond the first, attributed to faults as
//     below. Ingest events are left out of lateness and recovery (their due time is set at
//     acceptance, which the history does not see). Results.Ingest counts the ids, the ok
//     schedules and tombstones, the info ops and the ids that fired.
//
// # What is measured, not judged
//
//   - duplicates: per id and version (chime-version, 1 when absent), the records beyond the
//     first (records ordered by AppendMs, then partition, offset, topic), on any topic: the
//     record of a version an update or an upsert made is no copy. Each extra copy is attributed, by its append,
//     to the fault window whose [start, heal + DuplicateGrace] contains it, the one that
//     started last when several do, else to "none". DuplicateGrace defaults to 10 s: elections,
//     Raft catch-up and produce retries (backoff up to 5 s) settle within it. Invariant 3 says
//     duplicates happen only around leader changes and Kafka retries, so "none" is the count
//     to look at. Each copy is also given the step of the fire path that made it
//     (duplicates_by_step), from its chime-attempt header against the first copy's: the same
//     attempt is "refired" (taken from the shard's state again: its MarkFired never
//     committed), a later one "retried" (a produce its leader could not confirm, sent again).
//   - lateness_ms: for the first copy of every id some ok or info schedule carried,
//     lateness = (append − max(due, created)) / 1e6 ms, where created is the invocation of
//     the ok schedule that created the event (existing=false), else of the first schedule
//     that could have: an event accepted after its due time (a deliver_at in the past, a
//     retry of a request the cluster refused during a fault) fires at acceptance, and is
//     late only from then. The events of bursts (check 12) are left out. An event with a
//     window (Op.WindowNs, of the id's reference schedule, or of the upsert that made the
//     record's version) may fire anywhere in [due, due+window]: its lateness is counted from
//     the window's end, and a record inside the window is 0 ms late (one before its due stays
//     negative: a window never allows early, and check 2 ignores windows). Its period is
//     decided by the event's due: faulty
//     if the due lies in any fault window [start, heal], else after_heal if it is after
//     FinalHealNs (default: the latest heal), else healthy. Each period reports count, p50,
//     p99 and max; quantiles are nearest-rank (the value at rank ⌈q·n⌉ of the sorted values),
//     rounded to the microsecond. Duplicates are left out: they measure retries, not delivery.
//   - recovery: per fault window, in start order, recovery_ms = max(0, A − heal) / 1e6, where
//     A is the latest append among the first copies of acknowledged events whose due and
//     first acknowledgement (the earliest CompleteNs of an ok schedule), plus the window of
//     a windowed event, are ≤ heal, bursts' events aside (0 when there is none). An event
//     only ever answered info is left out: its schedule may have been applied after the
//     heal (a forwarded call held in a partitioned node's buffers arrives when the
//     partition heals, with its relative deadline still to run).
//     how long after the heal the backlog took to reach Kafka. Later duplicates are not
//     backlog and are left out.
//   - invalid_accepted: ops with f "invalid" (deliberately bad input, invariant 7) that
//     returned ok. Reported, not in valid; a record for such an op's id is a phantom anyway.
//   - ops (counts by f and type), acked_ids, delivered_ids, records, dead_letter_records.
//   - bulk_cancels: the ok cancel_matching ops that were not dry runs (ops), and the sums of
//     their matched, cancelled, skipped_fired and skipped_held.
//   - occurrences: the distinct occurrences of recurring schedules read back.
//   - bursts: per burst, by D: its tag, D, its ids, the ids compared, A, the drain A − D in
//     ms, why it was skipped ("" when checked), and its violations.
//
// Examples holds, per check (keyed like its count), up to [MaxExamples] findings in id
// order (backup_invalid's name the backup's directory, in history order; priority_violations'
// are in burst then append order), each an id and a
// one-line explanation with times relative to the run's start (the
// first op invocation).
//
// # results.json
//
//	{"valid", "lost", "early", "early_under_skew", "cancel_violations", "phantom",
//	 "idempotency_violations", "expired_early", "resurrected", "backup_lost", "backup_phantom",
//	 "backup_wrong_state", "backup_invalid", "update_violations", "stale_reads",
//	 "bulk_cancel_violations", "recurring_missing", "recurring_early", "recurring_phantom",
//	 "recurring_after_stop", "recurring_trigger_lost", "recurring_trigger_early",
//	 "recurring_backfill_lost", "recurring_backfill_outside",
//	 "priority_violations", "tenant_violations", "crashes", "ingest_lost",
//	 "ingest_after_tombstone", "ingest_after_replace", "ingest_rejected",
//	 "ingest": {"ids", "schedules", "tombstones", "unknown", "fired"},
//	 "bursts_checked", "bursts_skipped",
//	 "bursts": [{"burst", "due_ns", "events", "judged", "last_append_ns", "drain_ms",
//	             "skipped", "violations"}],
//	 "occurrences", "duplicates",
//	 "duplicates_by_fault": {kind|"none": n},
//	 "converged", "convergence_problems": [string],
//	 "lateness_ms": {"healthy"|"faulty"|"after_heal": {"count", "p50", "p99", "max"}},
//	 "recovery": [{"kind", "targets", "start_ns", "heal_ns", "recovery_ms"}],
//	 "disk_exits", "firing_orphans", "invalid_accepted", "ops": {f: {type: n}}, "acked_ids", "delivered_ids", "records",
//	 "dead_letter_records",
//	 "bulk_cancels": {"ops", "matched", "cancelled", "skipped_fired", "skipped_held"},
//	 "examples": {check: [{"id", "why"}]},
//	 "config": {"early_tolerance_ns", "cancel_tolerance_ns", "duplicate_grace_ns",
//	            "final_heal_ns", "dead_letter_topic", "retention_ns", "priority_tolerance_ns",
//	            "ingest_bound_ns", "ingest_rejected_topic"}}
//
// # report.html
//
// One self-contained page (no script, no external URL): the checks with valid and violated
// rows highlighted (and rows that sum up the lists and bulk cancels), lateness per period, duplicates by fault, faults and recovery, the
// backups (one row each: directory, node, times, outcome, shards, events, error; an invalid
// one flagged), the final state, op counts, examples, and two inline SVG plots: lateness vs
// due time (one dot per record, first copies, duplicates, phantoms and early records in
// their own colours) and latency over time (one dot per completed client op, coloured
// ok/info/fail; backups, which take seconds by design, are left out). Both use a
// symlog y axis (sign(y)·log10(1+|y|)), so outliers and early records stay on the plot
// instead of being clipped, and the largest lateness is labelled. Fault windows are shaded
// bands, one colour per nemesis kind, with a legend. Each plot draws at most
// latency.MaxPoints dots: dots on the same pixel of the same class are drawn once, then small
// classes are kept whole and the rest is sampled evenly in time; the legend says how many
// were drawn. The page is an html/template, so every id, topic, fault name and reason from
// the history is escaped.
//
// The quantiles (nearest rank, as above) and the plotter come from package
// cmd/internal/latency, which chimectl bench uses too, so the project has one definition of a
// quantile and one SVG plotter; this package decides what is plotted and in which colours.
package checker
