// Package snapshot keeps a shard replica's Raft snapshots and ships whole
// copies of the shard between replicas. Snapshots the replica takes are
// references into Pebble (a few bytes naming the applied index); a follower
// too far behind for the log is sent the shard's whole state, a reference
// expanded into a full stream (raftfsm.FSM.WriteSnapshot).
//
// # What it owns
//
//   - raft's snapshot store of one replica (Store, over a
//     raft.FileSnapshotStore in the replica's raft directory): references
//     as raft takes them, full streams as raft receives them, and the
//     expansion of a reference into a full stream when raft opens one to
//     send, written and read at the install rate (Config.Pace, NewLimiter).
//     The latest expansion is kept for Knobs.ExpansionReuse after its last
//     reader closed, so a send raft starts again sends the same bytes.
//     Whether raft restores its latest snapshot when the replica starts
//     (RestoreOnStart), and ErrStateLost when Pebble is behind a reference.
//     What a killed process left half-written, expansions and raft's
//     <id>.tmp snapshot directories, is deleted when the store opens
//     (TestOpenRemovesHalfWrittenSnapshots).
//   - Copies between replicas (Transport, install.go): sent on the shard's
//     install layer of the node's raft port, resumed where a cut send left
//     off (the follower keeps what it received of one copy), then handed to
//     raft on the follower as the data of an InstallSnapshot request that
//     carries none. A follower refuses a copy older than its own raft log.
//     A follower without an install layer is sent the copy inside raft's
//     request, as raft does.
//   - The log kept while a copy is sent (keeplog.go): from the first
//     expansion opened until Knobs.KeepLogGrace after the last one closed,
//     raft's TrailingLogs is raised to all of them (Config.SetTrailingLogs),
//     so the follower replays what was committed meanwhile; and the entry
//     at a snapshot's index, which a compaction keeps (KeepSnapshotEntry)
//     because raft asks for its term after a follower installs it.
//   - A full stream planted as the one snapshot of a new replica's raft
//     directory (Plant), and the pacing of other full streams (Paced).
//
// # What it must never do
//
// It never changes the shard's state: it reads the FSM's (an expansion
// reads a Pebble snapshot) and hands received copies to raft, which
// restores them through the FSM. It never hands raft a copy before it is
// whole and synced, nor one older than the replica's own raft log. It
// never calls into raft but through Config.SetTrailingLogs, and never
// after StopKeepingLog. It knows nothing of firing, leases or the wheel,
// and never imports package shard.
//
// # Goroutines
//
//   - Transport's accept loop on the install layer, one receiver per copy
//     coming in, and the pump that hands raft its RPCs: started by
//     NewTransport, stopped by its Close (after raft's shutdown), which
//     closes the install layer and the connections being received, then
//     waits for them.
//   - Timers, no goroutines of its own: the removal of the kept expansion
//     (stopped when it is reused or dropped; Close drops it) and the
//     release of the kept log (stopped by StopKeepingLog).
//
// # Locks
//
// Store.mu guards the expansions' references; logKeeper.mu the count of
// open expansions and is held across Config.SetTrailingLogs, so changes of
// raft's TrailingLogs do not interleave. Store.mu is taken before the
// keeper's (dropLocked), never the other way round.
package snapshot
