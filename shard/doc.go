// Package shard runs one replica of a Chime shard: a member of the shard's
// Raft group (hashicorp/raft, log and stable store in raft-wal) whose state
// machine is the shard's slice of the node's Pebble (raftfsm).
//
// # What it owns
//
//   - The replica's Raft group member: its configuration (Tuning, with every
//     default and its reason in config.go), its log (logstore.go: raft-wal in
//     the replica's directory, into which the raft-boltdb file of a build
//     before it is moved once, when the replica opens), its transport.
//   - The wiring of its snapshots (install.go), which package
//     shard/snapshot keeps and ships: the snapshot store (references into
//     Pebble, expanded into full streams for a follower too far behind,
//     written and sent at Tuning.InstallRate), the transport that sends
//     copies on the shard's install layer of the node's raft port
//     (InstallLayerID), resumably, and the log kept while one is sent,
//     for which this package changes raft's TrailingLogs
//     (setTrailingLogs). Knobs.KeepLogGrace, ExpansionReuse and
//     InstallSend are handed to it.
//   - The timing wheel of the shard's pending events due within the near
//     horizon (Tuning.WheelHorizon), kept warm on every replica by the apply
//     observer (observer: Scheduled, Settled, Reset) and by the horizon
//     loader (horizonLoop), which reads the events the horizon reaches from
//     Pebble's due index, so that a new leader fires from a wheel it already
//     has and memory holds only the events due soon.
//   - Changes of pending events (update.go, and Schedule's Replace
//     requests, pinReplaced): each reads the event under the lease, refuses
//     while a fire batch holds it or a produce of it may still land, pins it
//     out of the wheel (firing.pin) and proposes the change naming the
//     pinned seq, so that no fire batch reads the version the change
//     replaces.
//   - Whose event an operation acts on: a caller's Scope (its credential's
//     topics and id prefixes) is checked against the event as the leader
//     reads it for the operation (pinReplaced, Update, a scoped Cancel, a
//     create's Conflict), so that naming another credential's id gets a
//     NotPermittedError, the same whether or not the id exists.
//   - Changes of recurring schedules (recurring.go): an Update, Delete or
//     Pause removes the schedule's pending occurrence, so it is pinned and
//     named in the entry as an event Update's is; Create, Resume, Trigger
//     and Backfill remove none and are proposed as they come (Trigger and
//     Backfill create events from the definition the entry finds). Reads of
//     schedules follow the queries' rules.
//   - Queries and bulk cancels of one shard (query.go, forecast.go): List,
//     Count and Forecast under the lease (or, when the caller allows a stale
//     read, on any replica),
//     and the steps of a bulk cancel: list the next pending matches, leave
//     out those a record of may be on its way, cancel the rest in one Raft
//     entry and give each Cancel's promise. Merging the shards' answers
//     belongs to the caller (package cluster).
//   - Group commit: concurrent Schedule calls become one ScheduleBatch entry
//     (proposeLoop, applyWaitLoop), and the marks of many fire batches one
//     MarkFired entry (markLoop).
//   - Firing, on the leader only, under a lease (fire.go, firing*.go,
//     lease.go): after a barrier, take what falls due out of the wheel,
//     highest priority first when more is due than a batch holds, read it,
//     ask the topic rate limits, hold an early batch until it is due, drop
//     what was cancelled meanwhile, wait while a mark is stuck uncommitted
//     (a leader cut off from its followers; markFlight), take the lease,
//     produce through the Publisher, mark the outcome through Raft, and settle the batch. The
//     firing state (the firing type, with the wheel) reads time only from
//     its injected clock (Config.Now), which the firing loop (firing.run)
//     advances it by, and the lease only from its own (monotonic); so
//     hold, retry, probe, heal, lease expiry and the priority take are
//     tested on a synctest bubble's clock. Before a planned handover (a
//     drain, leadership balancing, TransferLeadership) the leader holds
//     every firing slot until its batches in flight are marked (quiesce),
//     and revokes its lease once the transfer succeeds: a batch produced
//     and not yet marked would be fired again by the next leader. A leader
//     that closes hands its shard over the same way first (handOffOnClose).
//   - Carrying an event's Output (its partition, its tombstone) from the
//     record read for a fire batch to the publish.Record, and keeping an
//     Update from giving a tombstone a payload (ErrTombstonePayload), which
//     it checks on the version the change is pinned to.
//   - The firing policy's place in the wheel: an event with a window is
//     held at the point of it its seq fixes (place, spreadAt); a record a
//     topic rate limit holds back goes back in for its slot (deferLocked).
//     The rules and buckets belong to shard/topiclimit, which this package
//     asks and never the other way.
//   - Re-firing: events a Publish call did not complete go back into the
//     wheel at a retry time (Tuning.RetryDelay doubling to MaxRetryDelay,
//     one backoff.ExponentialBackOff per replica). While batches fail, one
//     waiting event is fired every probeInterval as a probe, and the first
//     batch that produces without a failure brings every waiting event back
//     at once (firing.healLocked). Retrying a produce within one Publish call,
//     bounded by its ctx (the lease), belongs to package publish.
//   - Backups (backup.go): on the leader, a consistent full snapshot stream
//     of the shard after a Raft barrier (Backup), written at the install
//     rate; and the other way, a replica directory without Raft state whose
//     one Raft snapshot is such a stream, with this node as the only voter
//     (PlantSnapshot, which snapshot.Plant writes), from which a new
//     cluster's first node restores the shard when it opens.
//   - The leader's reconcile of its own Raft configuration toward the
//     placement, when Config.Directory is set (reconcile.go).
//   - Retention: with Tuning.Retention set, the leader proposes Expire
//     entries for the events settled longer ago than it (expireLoop), and
//     reports how far behind that clean-up is (CleanupLag).
//   - Parked events (firing.parked): Kafka acknowledged their records and
//     their MarkFired did not commit. Out of the wheel, in doubt, marked
//     again by this replica as leader (markParked) until the mark commits,
//     across lost and regained leaderships: never produced again here. A
//     new leader asks the other replicas for theirs before it fires
//     (askParked, at most parkedWait) and marks them too.
//   - The leader's sweep for lost events (sweep.go): an overdue pending
//     event that two checks found in no part of the firing goes back into
//     the wheel, counted and logged as the bug it is.
//   - Telling its owner when raft is wedged: Stuck reports a leader whose
//     raft has refused every entry, for a leadership transfer, far longer
//     than a transfer takes (a hashicorp/raft v1.7.3 bug strands one), and
//     a follower whose raft counts log entries its log store no longer
//     holds (the same raft's install of a snapshot on raft-wal leaves it so,
//     refusing every entry after); the owner reopens the replica.
//
// # What it must never do
//
// It never fires on a follower, and never hands a record to Kafka before the
// leader's clock reached its due time or outside a lease confirmed by a
// quorum after it was asked. It never acknowledges a cancel of an event a
// record of which may still reach Kafka (it answers ErrProduceUnknown or
// ErrCancelUnsure). It never blocks the raft apply goroutine: the observer
// does in-memory work under firing.mu only. It never changes the Raft
// configuration because gossip says so: only this shard's leader does, one
// change at a time, never below quorum. It never retries a produce itself:
// it hands the records to a later Publish call.
//
// # Goroutines
//
// Each has an owner that starts it and a stop path:
//
//   - proposeLoop, applyWaitLoop, markLoop, leadershipLoop, horizonLoop,
//     leaderWatch: started by Open, stopped by Close (close(stop), then
//     wg.Wait); a load
//     under way checks stop between chunks. proposeLoop fails the
//     queued proposals and closes applying, which ends applyWaitLoop;
//     markLoop fails the queued marks; leadershipLoop stops the firing loops.
//   - fireLoop (which turns the wheel in firing.run), with sweepLoop, a
//     retention expireLoop, and with a Directory reconcileLoop: started by
//     leadershipLoop (startFiring) when raft reports leadership, stopped by
//     the function startFiring returned (cancel their ctx, wait) when
//     leadership is lost or the shard closes.
//   - One goroutine per fire batch: started by fireLoop (dispatch) once the
//     batch has a firing slot; fireLoop waits for all of them before it
//     returns. Each settles its batch and ends; the firing ctx ends its hold
//     and its wait for a lease, the lease bounds its produce (plus
//     publish.Config.WriteTimeout for an answer under way), markTimeout its
//     marks.
//   - askParked's questions, one per other replica: started by fireLoop
//     after its barrier, each bounded by parkedWait, waited for before it
//     fires.
//   - quiesce's wait for the marks in flight: started by a handover once it
//     holds every firing slot, so no batch starts meanwhile; it ends when
//     they do (markTimeout), whether or not the handover waited that long.
//   - lease renewals (lease.renew): started by lease.deadline, at most
//     maxLeaseRenewals at once, each bounded by the lease length (its
//     Barrier's timeout); fireLoop waits for them (lease.end) before it
//     returns, so a lease of one term never serves the next.
//   - Shard.apply's waiter, and Backup's for its barrier: each ends when raft
//     resolves the future (bounded by applyTimeout or backupBarrierTimeout
//     for enqueueing, or by raft's shutdown).
//   - raft's own goroutines: stopped by raft.Shutdown in Close, after the
//     loops above and before the log store and the FSM close.
//   - raft-wal's segment rotation: started by opening the log store
//     (openLogStore), stopped by its Close, after raft's shutdown.
//   - The install transport's goroutines (snapshot.Transport): started by
//     Open when the replica has an install layer, stopped by the
//     transport's Close in Close, after raft's shutdown. The snapshot
//     store's timers: the kept log's release is stopped (StopKeepingLog)
//     before raft's shutdown, the kept expansion dropped
//     (snapshot.Store.Close) after.
//
// # Locks
//
// firing.mu guards the wheel, the handle table and the firing state (see the
// firing type); lease.mu guards the lease. Both are leaves: nothing else is
// locked, nothing blocks (no raft call, no Pebble read, no blocking channel
// operation) while either is held, and neither is held while taking the
// other. raft calls the observer with its own locks released, and the
// observer takes firing.mu; so firing.mu must never be held across a call
// into raft, which could wait for the apply goroutine. Fire batches' fields
// cancelled and sending are guarded by firing.mu; the rest of a batch is
// owned by its goroutine.
//
// # Invariants, and the test that pins each
//
//  1. Never early: a batch taken out of the wheel before its due time
//     (Tuning.FireLead) is held until its last entry is due by the shard's
//     clock (TestHoldUntilDue, TestFiringHoldsAnEarlyBatch,
//     TestEarlyBatchHeldAndCancellable, TestScheduleFireCancelRestart).
//  2. Records are handed to Kafka only within a lease from a quorum
//     confirmation (a Barrier) asked before it; batches share a lease renewed
//     ahead (TestLeaseRenewedAhead), and a lease no quorum renews runs out
//     (TestLeaseRunsOutWithoutAQuorum).
//  3. A cancel acknowledged as cancelled means no record of the event
//     follows: a batch that has not begun to produce leaves it out, one that
//     has is waited for, and an unanswered attempt, this leader's or an
//     earlier leader's around its due time, makes the cancel say so
//     (TestCancelWhileProduceUnanswered, TestEarlyBatchHeldAndCancellable,
//     TestInDoubtAfterLeaderChange).
//  4. At least once: every event taken out of the wheel is marked or goes
//     back into it (fire always settles its batch); a retried event is read
//     under its due time (TestRetriedEventsFire), after a backoff
//     (TestFiringRetriesWithBackoff); a restarted replica fires from Pebble
//     (TestScheduleFireCancelRestart).
//  5. After Kafka comes back, events that waited out a failed batch's retry
//     delay are produced within seconds, not when the delay ends
//     (TestHealWakesWaitingEvents): one waiting event is probed every
//     probeInterval (TestFiringProbesWhileFailing), and the first that
//     Kafka takes brings every waiting event back
//     (TestFiringHealBringsBackEveryWaitingEvent).
//  6. The handle table agrees with a map and frees empty pages
//     (TestHandleTable).
//  7. A node is added to a shard as a non-voter only once it has opened its
//     replica (TestPlan, TestReconcileAddsOnlyAnOpenReplica, and node/nodetest's
//     TestFreshStartLogsNoErrors); a non-voter is promoted or given
//     leadership only once its Raft log has caught up (TestPlan,
//     TestCaughtUpComparesRaftLogs); a new replica is
//     brought up from an expanded snapshot reference, over the install layer
//     or, from a node without one, inside raft's request
//     (TestFollowerCatchesUpFromAnExpandedSnapshot); it is sent one copy
//     while the leader snapshots (TestOneCopyWhileSnapshotsAreTaken), and a
//     copy whose send is cut is sent on from the cut
//     (TestInstallResumesAfterACut); a follower refuses a copy older than
//     its own raft log, whose entries past the copy raft would otherwise
//     count committed unchecked (shard/snapshot's
//     TestInstallRefusesACopyOlderThanTheLog).
//  8. A leader whose raft refuses entries for a stranded leadership transfer
//     is reported Stuck once that has lasted twice what a working transfer
//     takes (Knobs.StuckAfter), and not before (TestStuckLeadershipTransfer);
//     a follower whose raft counts entries its log store lost, once that has
//     lasted goneAfter, and not before (TestStuckFollowerWithoutItsLog).
//  9. Every pending event due before the horizon is in the wheel, in a fire
//     batch or waiting to retry, exactly once: a load and apply may meet in
//     any order (TestLoadRacesApply), and events scheduled beyond the
//     horizon, at its edge, and cancelled while on disk fire once, on time,
//     or not at all (TestHorizonFiresEventsAsItReachesThem).
//  10. A backup holds every entry committed before it was asked for; planted
//     in an empty replica it is restored when the replica opens, and raft's
//     log continues after the backup's applied index, so no new entry is
//     skipped as already applied (TestBackupPlantedFoundsTheShardAgain).
//  11. Get, List and Count answer only under a lease a quorum confirmed with
//     a Barrier (unless a stale read is asked for), so they see every entry
//     acknowledged before them, whoever acknowledged it
//     (TestGetOnlyUnderALease). A bulk cancel step counts an event as
//     cancelled only with the promise Cancel gives (TestCancelMatching).
//  12. An Update acknowledged as Updated means no record of an earlier
//     version follows: an event in a fire batch is refused
//     (TestUpdateRefusedWhileFiring), one pinned for a change stays out of
//     every batch while it commits (TestUpdatePinsTheEvent), and the new
//     version fires at its new time, sooner or later
//     (TestUpdateMovesTheDueTime); the same holds for a Schedule with
//     Replace, refused for its own event alone (TestReplace).
//  13. A replica whose log a build on raft-boltdb wrote opens on raft-wal with
//     its term, its vote and every entry after the last gap in its log, and
//     goes on from them (TestOpenLogStoreMovesABoltLog,
//     TestOpenLogStoreDropsEntriesBeforeAGap,
//     TestShardOpensAReplicaWrittenByRaftBoltdb); a crash during the move
//     leaves raft.db, which is moved again, or a whole wal, which is kept
//     (TestOpenLogStoreRedoesAnInterruptedMove,
//     TestOpenLogStoreKeepsTheWALOverABoltLog).
//  14. raft reads no entry a compaction removed, so a follower behind the
//     leader's log is sent a snapshot (TestLogStoreHidesCompactedEntries);
//     and a follower that installs one over its own log takes the entries
//     after it, raft-wal refusing a gap (TestRaftSeesAMonotonicLog,
//     TestFollowerWithALogInstallsASnapshot).
//  15. A leader whose Raft log writes hang (a frozen or wedged disk, the
//     process running and its network fine) stops leading: once a write has
//     been under way for Tuning.DiskStallAfter it sends no AppendEntries,
//     heartbeats included, until the write returns, so its followers elect
//     another leader a heartbeat timeout later instead of waiting out
//     DiskFailAfter for the process to stop; once its disk returns it
//     follows and catches up (TestLeaderWhoseDiskHangsStopsLeading).
package shard
