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
//     classified as a node's) acts for itself, unlimited, or, on a call it
//     forwarded (chimev1.ForwardedMetadata), for the credential that
//     chimev1.CredentialMetadata names, looked up in this node's file; on
//     a call it makes as a client for a signed-in console user
//     (chimev1.ActingForMetadata), for that credential too, and the call
//     then travels as a client's would; otherwise a bearer token ("authorization: Bearer <token>" metadata)
//     or a client certificate listed in the file. No credentials, an
//     unknown token or an unlisted certificate is UNAUTHENTICATED.
//   - The roles. admin: everything (the Admin service, the debug
//     endpoints, and the Scheduler service). scheduler: the Scheduler and
//     Recurring services, limited to the topics its patterns match
//     (path.Match globs: "billing.*") and, if it lists any, to ids with one
//     of its prefixes. reader: Get, List and Count, and Recurring Get and
//     List, limited the same way when its entry says so. Every role may
//     read the cluster map (Admin/GetClusterMap), which clients use to call
//     shard leaders directly. The Peer service is for nodes only. A call
//     outside the role is PERMISSION_DENIED with a message naming what is
//     missing. With require_id_prefixes, every scheduler's ids are its own:
//     the file is refused when two schedulers' prefixes overlap.
//   - What the request itself shows: the topic of what it creates, the id
//     it names against the prefixes, a query's filter. The grant of a
//     limited caller then rides in the call's context ([Scope]) to where
//     the operation reads the event or schedule it acts on (shard.Scope),
//     which decides whether that one is the caller's: auth never looks an
//     id up, so that the answer cannot race the operation, and an id
//     refused reads the same whether or not it exists.
//   - Console sign-in ([Authorizer.SignIn]): a token or the browser's
//     client certificate names the credential a console session acts for.
//   - The audit log: one JSON line per Admin call from a client, per call
//     a node certificate makes for itself, per console sign-in and change
//     a node makes for a console user, and per refused call: when, who,
//     what, the result.
//
// # What it must never do
//
//   - Keep a token in memory or in a log in the clear: only hashes are
//     stored, and callers are named by the file's names.
//   - Validate requests beyond what authorization needs: rpc does that
//     after auth has let the call through.
package auth
