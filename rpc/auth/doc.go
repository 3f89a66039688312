// Package auth decides who may call what on a node's gRPC port (and its
// debug endpoints), and writes down what it decided.
//
// # What it owns
//
//   - The auth file (chimed --auth-file): JSON mapping bearer tokens, stored
//     as SHA-256 hashes, and client-certificate common names to a role and
//     its limits ([Parse]). It is read again when it changes on disk
//     (checked at most once a second, on a call); a change that does not
//     parse is logged and the table in use is kept.
//   - Identifying the caller of every call: a node (a certificate rpc/certs
//     classified as a node's) is trusted with everything, as nodes relay
//     calls their own callers were authorized for; otherwise a bearer token
//     ("authorization: Bearer <token>" metadata) or a client certificate
//     listed in the file. No credentials, an unknown token or an unlisted
//     certificate is UNAUTHENTICATED.
//   - The roles. admin: everything (the Admin service, the debug
//     endpoints, and the Scheduler service). scheduler: the Scheduler
//     service, limited to the topics its patterns match (path.Match globs:
//     "billing.*") and, if it lists any, to ids with one of its prefixes;
//     calls that name an event by id only (Get, Update, Cancel) are checked
//     against the topic of the event the id names, when one exists. reader:
//     Get, List and Count. Every role may read the cluster map
//     (Admin/GetClusterMap), which clients use to call shard leaders
//     directly. The Peer service is for nodes only. A call
//     outside the role is PERMISSION_DENIED with a message naming what is
//     missing.
//   - The audit log: one JSON line per Admin call from a client (nodes
//     relay calls already logged where they entered) and per refused call:
//     when, who, what, the result.
//
// # What it must never do
//
//   - Keep a token in memory or in a log in the clear: only hashes are
//     stored, and callers are named by the file's names.
//   - Validate requests beyond what authorization needs: rpc does that
//     after auth has let the call through.
package auth
