// Package console is Chime's web console, served by every node on its HTTP
// port under /ui/: find any event by id or prefix, act on one (cancel,
// reschedule, fire now, edit) or on every event a filter selects (a bulk
// cancel with a dry-run count, a typed confirmation and live progress),
// and see the cluster.
//
// # What it owns
//
//   - Sign-in and sessions: on a node with an auth file a person signs in
//     with a token (or the client certificate the browser presents), and
//     the session is a random id in a Secure (under TLS), HttpOnly,
//     SameSite=Strict cookie that expires; every form carries the
//     session's CSRF token. Sessions live in the node's memory: a restart
//     signs everyone out.
//   - Acting for the signed-in credential, and only for it: the console is
//     a client of the cluster's public gRPC API through package client,
//     dialling its own node with the node's certificate and naming the
//     credential (chimev1.ActingForMetadata), so every call is authorized,
//     limited and audited as that credential's. It holds no power of its
//     own: a reader's console offers no action, and the API refuses any it
//     is sent.
//   - The pages: server-rendered Go templates and a stylesheet embedded in
//     the binary. Every page reads without scripts, and its filters are
//     in its URL, so it can be bookmarked and shared. Each action names the
//     chimectl command that does the same. The events page counts its
//     matches beside its first page, in a goroutine its request owns and
//     cancels when it ends, and waits for the count only within a short
//     budget (countBudget): a broad filter's count reads every match. A
//     count not done in time is filled in by a script from
//     /ui/events/count, or, without scripts, by a link to the page that
//     waits for it. Each events page says its server time in a
//     Server-Timing header.
//   - The timeliness figures: a sampler goroutine, owned by the Console
//     (started by New when Config.Metrics is set, stopped by Close), reads
//     the node's metrics registry every ten seconds into rings in memory
//     (a sample a minute for an hour, one every ten minutes for a day), so
//     the timeliness page needs no Prometheus. Each node serves its figures
//     as JSON under /ui/timeliness.json, without a sign-in, as /metrics
//     serves what they are made of; the page adds up every live node's.
//   - Bulk jobs: a bulk cancel runs in the node, owned by the Console,
//     reporting the streamed totals to its page; Close cancels the ones
//     still running (what they cancelled stays cancelled; running the same
//     bulk cancel again finishes the rest).
//
// # What it must never do
//
//   - Act with the node's own authority: every call names the signed-in
//     credential, or, on a node without an auth file, no one (such a node
//     grants every caller everything already).
//   - Change anything on a GET, or on a POST without the session's CSRF
//     token, or in read-only mode.
//   - Keep a token: a session holds the credential's name, never its
//     token.
package console
