// Package raftmux carries every shard's Raft traffic over one TCP port per
// node. A dialled connection starts with a fixed header naming the shard,
// after which it belongs to that shard's raft.NetworkTransport unchanged:
//
//	"CHRM" | version (1 byte) | shard (4 bytes big-endian)
//
// With TLS (New's TLS: a node's Raft port whenever the node has TLS on) the
// header is the first thing sent inside a TLS connection, after a mutual
// handshake whose configurations accept only nodes of the cluster; a
// connection whose handshake fails is closed before anything is routed.
// Which of those nodes may speak is the caller's to say: TLS.Admit sees each
// accepted connection's layer and handshake before it is routed, and
// TLS.Dialled each dialled one's before raft gets it.
//
// # What it owns
//
//   - The node's Raft listener, from New until Close.
//   - One raft.StreamLayer per id ([Mux.Layer]): Accept hands it the
//     connections whose header names its id; Dial writes the header. A
//     shard replica registers two, its raft transport's (the shard id) and
//     its install layer's (package shard's InstallLayerID); the mux knows
//     only the ids.
//
// # What it must never do
//
//   - Read or write anything after the header: the bytes belong to raft.
//   - Know about shards beyond their id, or import package shard (shard's
//     tests build replicas on it).
//   - Keep a connection it cannot route: a connection without the header
//     within 5 s, with another magic or version, or for a shard without a
//     registered layer is closed, and so is one routed to a layer that
//     closes before raft accepts it.
//
// # Goroutines
//
//   - The accept loop, started by New, stopped by Close (which closes the
//     listener and waits for it).
//   - One goroutine per accepted connection while it runs the TLS handshake
//     and reads the header (at most 5 s for both); the accept loop waits for
//     them before it returns.
//
// Close also closes every layer, so raft's Accept returns net.ErrClosed.
package raftmux
