// Package raftfsm is the deterministic state machine of a Chime shard: it applies committed
// Raft log entries (hashicorp/raft) to a shard's slice of the node's Pebble database, answers
// the reads the firing path and the API need, and streams and restores shard snapshots.
//
// # What it owns
//
//   - The meaning of a committed command: ScheduleBatch, Cancel, Update, MarkFired,
//     MarkDeadLettered, Expire and Recurring, their binary encoding (DecodeCommand is the only decode path; the
//     Append* functions encode), and the result each one produces.
//   - Every key of its shard in the node's Pebble (one Store per node, one FSM per shard;
//     Store.DropShard deletes a shard's keys when the placement moves the replica away).
//   - The shard's event lifecycle: Scheduled → Fired | Cancelled | DeadLettered → removed.
//     Nothing leaves a final state except to be removed: by an Expire entry, once the
//     retention the leader applies has passed since it settled, or by a Schedule with
//     Replace of its id, which schedules the id anew. An event's versions: an Update (or a
//     Replace) of a pending event removes it and creates its next version under a new seq,
//     bound to the same id, so that a seq's due time and content never change.
//   - Recurring schedules (recurring.go): a definition (the rule and the target) and a
//     cursor (where the schedule is) per schedule, and the chain of its occurrences. An
//     active schedule has exactly one pending occurrence, an ordinary event with the id
//     <schedule id>@<nominal Unix ms> and the headers chime-recurring-id and
//     chime-occurrence-unix-ms; when it settles (fired, dead-lettered, or cancelled by its
//     id) the same apply derives the next one from the rule (package recurrence) and the
//     entry's time, and creates it, so that a leader change can neither skip nor repeat
//     one. Pause, Delete and Update cancel the pending occurrence as a Cancel would; an
//     Update or Replace of the occurrence's own id moves the schedule to its next version.
//     Trigger and Backfill create occurrences outside that chain, from the definition as
//     their entry finds it: ordinary events with the occurrence ids and headers that no
//     cursor names, so that their settling moves nothing and counts in no schedule.
//   - The applied index: which log entry the Pebble state reflects.
//
// It does not decide anything: timestamps, due times and content hashes arrive inside the
// commands, decided by the leader and the rpc layer (ContentHash is here so both sides hash
// the same way). It does not validate client input either (invariant 7 belongs to rpc); it
// applies what was committed.
//
// # Invariants
//
//  1. Apply is deterministic (design invariant 5). It reads no clock and no randomness, does
//     no I/O but Pebble, and iterates no map in a way that reaches the output. Replicas fed the
//     same log hold byte-identical shard key spaces (TestDeterministicKeySpace).
//  2. An entry that cannot be decoded, or a Pebble failure during apply, panics: the replica
//     can no longer be trusted to hold the same state as its peers and must stop loudly. A rule
//     violation ("already fired", "different content for this id") is a result, identical on
//     every replica.
//  3. The applied index and term are written in the same Pebble batch as the state change
//     they produced, so Pebble always holds a state that is exactly "the log up to
//     AppliedIndex". Entries at or below it are skipped: with NoSnapshotRestoreOnStart, raft
//     re-applies the log after its last snapshot on every start. (AppliedIndex may trail
//     raft's own applied index by no-op and barrier entries, which raft never hands to an
//     FSM; they carry no state. raft's snapshot index counts them too, so it is compared
//     with nothing here: a snapshot's header records the FSM's applied index.)
//  4. Pebble has no WAL: the Raft log (raft-wal, fsynced) is the durability point, and
//     what a crash takes from the memtables is re-applied from it (Pebble flushes memtables
//     in order and an apply's batch is atomic, so what survives is "the log up to
//     AppliedIndex" for an older index). This is only sound if raft never truncates log
//     entries whose effects Pebble may lose, so a snapshot's Persist returns only once the
//     flushed tables hold the snapshot's index (after Pebble's own next flush, or one it asks
//     for after StoreOptions.SnapshotFlushWait or Stopping); raft truncates only entries at
//     or below a snapshot's index.
//     Restore flushes too, after the swap, because raft drops its log behind an installed
//     snapshot, and so does DropShard, which no log re-creates. Since a write is durable
//     only once flushed, a store that cannot flush (Pebble retries a failed flush forever)
//     or whose disk hangs says so through StoreOptions.Failed after FailAfter, and its
//     owner stops the process rather than go on leading shards it cannot apply to.
//  5. A pending event (state Scheduled) has exactly one due-index key and no status key; every
//     other stored event has a status key, one settled-index key at the time it settled, and
//     no due-index key. An expired event has no key at all. The in-memory counters equal the
//     counters stored in Pebble after every commit, and the in-memory pending set, once its
//     background build is taken in, holds exactly the seqs of the due index (pendingMirror;
//     until then apply tells a pending event by its due-index key, with the same results),
//     and, loaded with it, the in-memory due counts hold, minute by minute, how many of the due
//     index's keys fall in each minute of Unix time (dueCounts, which Forecast reads instead of
//     the due index; wantDueCounts checks it wherever wantPendingSet runs). A
//     pending event's status is exactly {Scheduled, due}, which is what lets a MarkFired
//     carrying due times (MarkFired.DueKnown) settle it without reading it.
//  6. Idempotency (design invariant 6): an id is bound to the first event created with it
//     until that event expires, and then to each next version of it. The same id with the
//     same ContentHash returns the current Seq and Due; a different hash is a Conflict.
//     Within one ScheduleBatch the first occurrence wins. After the event expires the id is
//     free, and a Schedule with it creates a new event with a new seq. A Schedule with
//     Replace is never Existing or a Conflict: it makes the next version (Replaced, or
//     Renewed for a settled event), and its hash is the one a re-send is compared with
//     from then on; an Update keeps the hash. Versions count from 1, one more per Update or
//     Replace, and a superseded version's seq names nothing, so a MarkFired for it finds it
//     gone (WasExpired) and changes nothing. An entry sees the state exactly as if applied alone, whatever
//     raft batched it with: an Expire also removes what earlier entries of its batch settled,
//     and later entries no longer find what it removed.
//  7. Sequence numbers are assigned in apply order, start at 1, and are never reused. Every
//     seq ever assigned is pending, settled (retained, expired or renewed) or superseded: the
//     next seq is 1 + pending + fired + cancelled + dead-lettered + replaced.
//  8. Raft state is a claim about Pebble and never outlives what it names. A snapshot
//     reference says "Pebble holds the log up to AppliedIndex I" (its header's I, the FSM's),
//     and raft never re-applies what it believes a snapshot holds. So the owner starts raft
//     without a restore when AppliedIndex reaches I; restores a full stream (received from a
//     leader) that holds more; and never restores a reference over the Pebble it names: a
//     Pebble behind its own reference has lost state, and the replica refuses to start.
//     Releasing a replica makes its Raft state unusable durably before DropShard removes
//     its keys, so a crash between them leaves no Raft state over a dropped shard; and keys
//     with no Raft state beside them are dropped before an FSM opens on them, because a new
//     Raft log starts at index 1 and an FSM already past it would skip its entries as
//     replayed.
//  9. A recurring schedule has a cursor and a definition, or neither. Its cursor names a
//     pending occurrence exactly when it is active, and that event is pending and named by
//     no other cursor; the FSM's in-memory occurrence map holds exactly the cursors'
//     pending seqs (built from them on open and after a Restore, which refuses a stream
//     that breaks this). Each settled occurrence moves its cursor on in the same batch, so
//     a replayed log, a reopened replica and a restored one make the same next occurrence
//     (TestRecurringWalk, TestRecurringAcrossRestartAndSnapshot,
//     TestRestoreRefusesBrokenSchedules). The FSM's in-memory schedules hold exactly the
//     cursors and definitions Pebble holds after every commit (a definition's target only
//     when small), so that settling an occurrence reads neither: a batch's changes reach
//     them only once it commits (TestRecurringRandomHistories).
//
// # Concurrency
//
// Apply, ApplyBatch, Snapshot and Restore are called by raft from one goroutine (the "apply
// goroutine"). Reads (Get, ReadForFire, ForEachPending, List, Count, Forecast, Stats, AppliedIndex) may
// run on any goroutine concurrently with them: each read uses one Pebble iterator (or clones
// of one), so it sees one
// committed state: during a Restore, the state before it until the swap, then the restored
// one. Over a restoring marker the version before left, reads return ErrRestoring rather than
// a half-loaded shard. The Observer is called on the apply goroutine, after the batch is
// committed, in apply order; it must be cheap (the wheel insert/remove is). Each FSM also runs
// one background goroutine after it opens and after each Restore: the scan that completes its
// id filter (idFilter), which Close, Restore and Store.Close stop and wait for.
//
// # Key layout
//
// Every key starts with the shard id as 4 big-endian bytes, then a tag byte. The shard's span
// is [shard|0x00, shard|0xff): tags are ASCII letters, so a DeleteRange over the span never
// touches another shard. This is key layout 4, named by the meta value's first byte.
//
//	shard|'m'                        meta: layout (4), applied index, applied term, next seq,
//	                                 counters (pending, fired, cancelled, dead-lettered,
//	                                 refired, fired after cancel, expired, replaced, renewed)
//	shard|'i'|id                     seq (8 BE) | content hash (8 BE) | due (8 BE)
//	shard|'b'|due(8)|seq(8 BE)       body: id, createdAt, topic, key, payload, headers, hash,
//	                                 and in format 2 (a version after the first) the version,
//	                                 in format 3 (a policy other than the default) the
//	                                 version, the priority and the window, in format 4 (an
//	                                 Output: a partition or a tombstone) all of format 3,
//	                                 then the output's flags and, if any, the partition
//	shard|'d'|due(8)|seq(8 BE)       the event's policy: empty for the default (priority 5,
//	                                 no window), else the priority and, if any, the window;
//	                                 present only while the event is pending
//	shard|'s'|seq(8 BE)              status: state, due, fired/cancelled/dead-lettered at,
//	                                 attempts, last error, dead-letter topic; written once,
//	                                 when the event leaves Scheduled
//	shard|'x'|settledAt(8)|seq(8 BE) due (8 BE); the settled-time index, written with the
//	                                 status: Expire walks it from the start
//	shard|'r'                        restoring marker, written only by the version before:
//	                                 its Restore began and did not finish
//	shard|'C'|schedule id            a recurring schedule's cursor: state, version, content
//	                                 hash, times, the instant after which its next
//	                                 occurrence falls, its pending occurrence (seq and
//	                                 nominal instant), occurrences settled; rewritten at
//	                                 every occurrence
//	shard|'R'|schedule id            its definition: the rule and the target; rewritten only
//	                                 by a Create or an Update
//
// List and Count need no index of their own. Under an id prefix they read the id index, whose
// entries hold each event's due time, so a narrow prefix costs its matches and the sort of
// them; a query without a prefix, or with one matching more than prefixScanLimit ids, walks
// the bodies in due order, which is List's order, and reads each event's id and topic from
// the head of its body. A topic alone is matched that way: Count by topic reads every body,
// which is why no topic index costs every Schedule a fourth key. A priority is matched the
// same way, from the body's tail (reached by skipping the key, payload and headers by their
// lengths; a body without a policy has the default priority), except that Count of pending
// events by priority reads the due index alone, whose values hold each event's policy.
//
// An event is an immutable body and, once it is settled, a small status. Bodies are keyed by
// due time: a fire batch is the events that fall due together, and reading them is a walk
// over neighbouring keys with forward seeks (key layout 1 keyed bodies by seq, and a batch
// due in one second was a thousand seeks all over the shard: BenchmarkReadForFire read
// 160,000 events/s that way, 816,000 with bodies keyed by due time). A pending event
// has no status: it is {Scheduled, due}, which the due index and the in-memory pending set
// say, so creating an event writes three keys and settling it two (the status and the
// due-index deletion) without rewriting the payload. The id entry holds the due time because
// it is half of the body's key. The due encoding is uint64(due) XOR 1<<63, which orders
// negative (pre-1970) instants correctly, so nothing is clamped and ForEachPending reports
// the exact due. The due index exists for ForEachPendingIn (the shard owner loads its wheel
// from it one stretch of due times at a time, so memory holds only the events due soon), for
// building the pending set, and for ReadForFire to tell pending events from settled ones in
// the same forward walk.
//
// Expire removes the oldest settled events: it walks the settled-time index, finds each
// body by its due and seq, reads the id out of it, and deletes the body, id and status keys;
// the index entries it consumed go with one range deletion of the index's head, so that the
// next walk from the start steps over one tombstone, not one per event removed so far. Settled-time
// order is close to due order for fired events, so the bodies it reads are mostly
// neighbours.
//
// Body and status values start with a format byte so that a change can be recognised:
// statuses and first-version bodies are format 1, a later version's body is format 2, which
// appends the version (almost every event keeps its first version, and spends no byte on
// it), and the body of an event with a priority or a window is format 3, which appends the
// version, the priority and the window; the body of an event with an Output (a partition it
// is produced to, a tombstone) is format 4, which appends to format 3's a flags byte and the
// partition (a uvarint) when it has one. An event without an Output is stored exactly as it
// was before events had one (TestBodyWithoutOutputIsUnchanged), and the firing path learns
// the Output from the body it reads anyway, so the due index does not carry it. The id
// entry is a fixed 24 bytes. The due index's
// entries carry the policy the firing path orders and places events by, so that neither a
// load of the horizon nor a rebuild of the wheel reads a body; an event of the default
// policy (every event stored before events had one) has an empty entry. Layout 3 is
// layout 4 without the replaced and renewed counters (and so without format 2 bodies): it is
// read as layout 4 with both at zero, and its meta rewritten in layout 4 by the next apply.
// Layout 2 was layout 3 without the settled-time index and the expired counter: a shard in it
// is converted when it is opened, or restored from a format 2 stream (upgradeLayout), by
// writing the index from the statuses. A shard stored in layout 1 is refused with
// ErrOldLayout: nothing converts it, and a node holding one starts on an empty data directory
// and receives the shard from its peers.
//
// # Snapshot stream
//
// The snapshot raft takes and keeps (Snapshot, then Persist) is a reference: the header below
// with the magic "chimeref", then the CRC-32C of the header, nothing else. The state it names
// is this replica's own Pebble, at the applied index and term in the header (ReadSnapshotHeader
// reads them; every reference ever written has this form). The full stream, which a reference expands to when raft sends
// a snapshot to another replica, is written by WriteSnapshot from a Pebble snapshot handle:
//
//	header   "chimesnp" | format version u32 BE (3: the current key layout; 2, layout 2, is
//	         read too) | shard u32 BE | applied index u64 BE | applied term u64 BE
//	         (format 3: every byte after the header is in snappy's framing format, which
//	         checksums each chunk; format 2 is uncompressed)
//	frames   uvarint len(key) | key without the shard prefix | uvarint len(value) | value
//	         (in key order; keys are never empty)
//	end      uvarint 0
//	trailer  frame count u64 BE | CRC-32C (Castagnoli) u32 BE of every byte before it
//
// Restore checks the header before touching anything. It then writes the frames into
// sstables of its own in a staging directory beside Pebble's files (a new table every 64 MiB of
// keys and values, so memory stays bounded), refusing a frame with an unknown tag, a key not
// strictly after the one before, a length past the bounds, a key not of its tag's shape or a
// value that does not decode (a status saying Scheduled among them: what Restore takes, every
// read and apply can decode, so a received stream can never make an apply stop the replica),
// and growing its buffers only as bytes arrive. Only after the trailer verifies, and the
// meta's counters agree with the keys the stream held (pending with due-index keys, retained
// settled events with status and settled-index keys, stored events with id keys and bodies,
// the next seq with the events ever assigned and above every seq a key names, no more expired
// and renewed than settled, no sum of them past 2^64; a stream with keys has a meta key),
// does anything change: Pebble ingests the
// tables and excises the shard's old keys in one atomic version edit, and a flush makes it
// durable. A refused stream leaves the replica exactly as it was, and a crash at any point
// leaves the old state or the new one. VerifySnapshot makes the same checks, but for the
// staging and the swap, on a stream with no Pebble to restore into: a backup (a full stream
// per shard, written by WriteSnapshot on the leader) is checked so before it becomes a new
// node's data (TestVerifySnapshotRefusesWhatRestoreRefuses). ForEachSnapshotEvent reads a
// full stream through the same checks and reports the events it holds (id, seq, due, state),
// checking too that each event's keys agree with its body; it reports nothing of a stream
// that does not verify (it holds every event's id and state until the trailer), so that a
// backup's contents can be read, by chime-jepsen for one, without a Pebble to restore into.
// VerifySnapshotTargets makes VerifySnapshot's checks and, in the same pass, reports the topic
// of every event and every recurring schedule's definition as it reads them (before the
// trailer verifies), so that chimed restore refuses a backup targeting a reserved topic
// without reading it twice. The restoring marker (shard|'r') is written by no
// version since; one left by an interrupted restore of the version before, which wiped the
// shard first, still makes NeedsRestore report true and Apply refuse to run, until a restore
// replaces the span it lies in.
package raftfsm
