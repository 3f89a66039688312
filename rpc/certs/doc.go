// Package certs turns PEM files into the TLS configurations of a Chime node's
// listeners and dialers, and of chimectl, and picks up new files without a
// restart.
//
// # What it owns
//
//   - Reading a certificate chain and key, and CA bundles, from PEM files
//     ([Files]), with errors that name the flag and the file. A node's own
//     certificate is checked at start: it must be signed by the node CA
//     (--tls-ca) and name [NodeName], or the node would be refused by every
//     other node it talks to.
//   - Reloading. Every handshake asks [Source] for the current material; at
//     most once a second that stats the files, and if any changed (size or
//     modification time) loads all of them again. A reload that fails (a
//     half-written file, a key that does not match its certificate) is logged
//     and the material in use is kept, so a botched rotation never takes a
//     node down; the next change is tried again.
//   - Who is who. Nodes and clients may share a CA, so a certificate is a
//     node's only if it chains to the node CA AND names [NodeName] as a DNS
//     subject alternative name (as Consul's server.<dc>.consul and Nomad's
//     server.<region>.nomad do). The Raft port accepts nodes only, always
//     mutually; the gRPC and HTTP ports accept nodes, and clients whose
//     certificate chains to the client CA (--tls-client-ca, which makes
//     client certificates required there); a node dialling another node
//     presents its certificate and accepts only a node. [Identity] is what the
//     gRPC port learned about the caller, per connection, for the auth layer.
//
// # What it must never do
//
//   - Accept a certificate it did not verify: every peer certificate a
//     listener or dialer sees is verified against the current pools (Go's own
//     verification is replaced by one that reads the pools at handshake time,
//     so a rotated CA applies to the next connection).
//   - Start a goroutine: reloading happens on the handshake that notices the
//     change.
//   - Allow TLS below 1.2.
package certs
