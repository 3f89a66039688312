// Package membership turns gossip into a view and a desired placement; it
// decides nothing alone.
//
// # What it owns
//
//   - The node's gossip member (hashicorp/memberlist v0.5.4): joining through
//     seeds, failure detection, and the metadata a node advertises (Meta: its
//     id, its gRPC, Raft and HTTP addresses, the Draining flag and the cluster
//     parameters fixed at creation). Metadata that does not decode, or that
//     advertises parameters no cluster has (a shard count outside
//     1..MaxShards, a negative retention), leaves the node a member with its
//     id alone: never placed on, nor learned from.
//   - Gossip encryption: the member's keys (Config.Keys, SetKeys) and the
//     key file format (ParseKeyFile). See Gossip encryption below.
//   - The View: every node this node has heard of, with its Meta, its State
//     (Alive, Dead, Left) and when it entered that state by the local clock.
//     Dead and left nodes stay in the view (memberlist forgets them after
//     GossipToTheDeadTime), so a leader can tell how long a node has been
//     gone. A node that rejoins under the same id is Alive again.
//   - The desired placement, in place.go: View.Candidates (who may hold
//     replicas), Place (rendezvous hashing of one shard over the candidates)
//     and Placement (every shard's set, with a preferred leader first so that
//     leaders spread evenly). All are pure functions: same inputs, same
//     answer, on every node. The node's control plane (package cluster)
//     recomputes them as the view changes.
//
// # What it must never do
//
//   - Change a Raft configuration, or ask anything else to. Gossip never
//     authorises a membership change by itself: each shard's Raft leader
//     reads the view, computes Place, and reconciles its voters through Raft
//     (one change at a time, never below quorum). Two nodes' views may
//     differ for a while; only the leader's reading counts, and only through
//     Raft.
//   - Read the clock to make a placement decision. Candidates takes now as an
//     argument; Config.Now only stamps when a state was observed.
//   - Treat Dead as gone. A dead node keeps its replicas for the caller's
//     deadTimeout, so a restart does not move data.
//   - Accept gossip it cannot decrypt once it has keys: plaintext and
//     foreign keys are dropped (memberlist's GossipVerifyIncoming), and
//     nothing leaves unencrypted (GossipVerifyOutgoing).
//   - Log or expose a key: keys are named by KeyID, a truncated SHA-256.
//   - Let two live nodes share an id. The node id is memberlist's node name;
//     memberlist refuses a second live node with the same name at another
//     address and Start fails with ErrNodeIDConflict.
//
// # Gossip encryption
//
// Config.Keys turns on memberlist's keyring: every packet and stream is
// sealed with AES-GCM under the primary key (Keys[0]) and opened with
// whichever installed key works. A member without a key the others use
// cannot join: the seeds drop what it sends, it cannot read their answer,
// and Start fails with the reason and a hint (the first failed attempt is
// logged as a warning; a member with peers but no seeds, a restart, warns
// from its reconnect loop instead); the members log the dropped gossip as a
// warning at most every 10 s. Encryption is on or off for a member's lifetime: a
// cluster is created with it, or restarted into it all at once.
//
// SetKeys changes the keys of a running member (chimed re-reads
// --gossip-key-file). On one member it installs new keys before switching
// the primary and removes keys only after, so the member can always read
// what it could. Across the cluster a member can read a packet only if it
// holds the sender's primary, so a rotation is three steps, each applied on
// every member before the next begins:
//
//  1. add the new key as a secondary (keys: old, new): everyone still
//     sends with the old key and can now read the new one;
//  2. make the new key the primary (keys: new, old): members that switched
//     send with it, those that have not yet still read it;
//  3. remove the old key (keys: new): nobody sends with it any more.
//
// Skipping a step cuts the members that moved first off from those that did
// not, until they catch up: long enough, and they are declared dead.
// TestGossipKeyRotation runs the three steps on three members and shows a
// member cut off when it skips them; TestGossipKeyRequired shows each kind
// of stranger refused.
//
// # Failure detection with the defaults
//
// A node probes one other node per ProbeInterval (1 s), round-robin in a
// shuffled order, waiting ProbeTimeout (500 ms) for a direct ack and the rest
// of the interval for indirect ones. A node that does not answer becomes
// suspect for SuspicionMult*max(1, log10(N))*ProbeInterval = 4 s (N <= 10;
// up to 6x that when no other node confirms the suspicion), then dead, and the
// death is gossiped. Measured on loopback: a killed node is Dead on every
// other node after 5-7 s with 3 or 5 nodes. A graceful Leave is seen as soon
// as it is gossiped (a gossip interval or a probe).
//
// # Idle cost
//
// Per node: one ping and ack per second, a gossip tick every 500 ms (sending
// only when there is news), and a TCP push/pull every 30 s. Measured: three
// nodes in one process idle at about 0.2% of one core together.
//
// # Memberlist v0.5.4 quirks this package works around
//
//   - The node passed to EventDelegate.NotifyLeave always has State
//     StateAlive (nodeState.State shadows Node.State;
//     hashicorp/memberlist#293), so memberlist does not say whether a node
//     left or failed. Leave therefore first sends every live member a
//     "leaving" user message over TCP (SendReliable), then leaves; a member
//     reports Left when the announcement came before or after the leave,
//     Dead otherwise. Gossiping a flag in the metadata first (UpdateNode) is
//     not enough: UpdateNode returns once the update was transmitted a few
//     times to random nodes, recently dead ones included, so some members
//     can miss it. A member the announcement misses reports Dead, which
//     placement treats the same.
//   - There is no callback for suspicion and no accessor for a node's state,
//     so Suspect is never reported: a suspected node stays Alive until it is
//     declared Dead (the suspicion time is part of the detection time above).
//   - By default a dead node's name cannot return from another address until
//     memberlist forgets it (GossipToTheDeadTime, 30 s). Config.
//     DeadNodeReclaimTime sets how long instead (1 ns by default; chimed
//     passes --dead-timeout, so a crashed node's id is not taken over from
//     elsewhere before its replicas would be replaced anyway). A node that
//     left gracefully may return from a new address at once. One that
//     gossips a dead node's id from another address earlier is not heard
//     as that node: the others report a conflict and keep the dead one at
//     its old address until the time has passed, then take the newcomer.
//     A live node's id is never taken: Start keeps retrying until
//     JoinTimeout, so a quick restart waits out failure detection while a
//     real duplicate id fails with ErrNodeIDConflict.
//   - A node that rejoins after a restart starts again at incarnation 1,
//     below what the others remember; it gets back in by refuting the
//     dead/left state the seeds send it on join, not by its first alive
//     message.
//   - Keyring.RemoveKey shifts the keys after the removed one in place, in
//     the array that receivers read without the keyring's lock (GetKeys
//     returns it). SetKeys removes keys last first, so in the documented
//     rotation (the old key is the last) nothing is shifted.
//   - Members() and Node.State cannot be used for a view: Members() drops
//     dead and left nodes and Node.State is never set.
//   - Memberlist calls the event delegate with its node lock held and may
//     call it after Shutdown (a suspicion timer firing late); the delegate
//     only updates the view and never calls back into memberlist.
package membership
