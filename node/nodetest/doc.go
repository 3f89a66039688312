// Package nodetest runs Chime clusters inside a test process, in the
// manner of hashicorp/raft's testing.go (MakeCluster, Partition): each node
// is the production assembly (package node) with real Pebble in a temporary
// directory, real Raft on raft's in-memory transport, real memberlist on an
// in-memory network, the real control plane (package cluster), and gRPC
// and HTTP servers on loopback, publishing to a kfake broker.
//
// # What it owns
//
//   - The in-memory networks: per shard, raft.InmemTransports connected
//     across the nodes that can reach each other (raftNet); for gossip, a
//     memberlist.NodeAwareTransport network that drops packets the way UDP
//     does (gossipNet).
//   - Node lifecycle for tests: Add (join), Kill (cut off, then closed, so
//     the others see a crash), Stop (graceful), Restart (same data, gossip,
//     gRPC and HTTP addresses), Partition and Heal.
//   - Observation: Leader (from the replicas themselves), Status and
//     WaitConverged (from a node's Admin API), and WaitFor, which polls a
//     condition with a deadline.
//
// # What it must never do
//
//   - Sleep and hope: every wait polls a condition until a deadline and
//     fails the test with what it saw.
//   - Reach into a node past its exported API to make something happen: a
//     test drives nodes as clients and operators do, and faults through the
//     networks.
//   - Be imported by non-test code.
//
// # Goroutines
//
// Everything a node starts is stopped by its Close, which Kill, Stop and
// the test's cleanup call; the in-memory networks start no goroutines (a
// gossip dial waits for the receiver or its timeout). The package's tests
// check with goleak that nothing is left running.
package nodetest
