// Package backup is the on-disk format of a Chime backup, the directory
// `chimectl backup --out DIR` writes and `chimed restore --from DIR` reads,
// and the client that takes one (Take), which chimectl backup and
// chime-jepsen's periodic backups both run.
//
//	DIR/shard-000.snap   one file per shard: the shard's full snapshot stream as its
//	DIR/shard-001.snap   leader wrote it (chime.v1.Admin/Backup; the format is raftfsm's,
//	...                  with its own version, frame count and CRC-32C)
//	DIR/manifest.json    written last: the format version, the source cluster's id, when
//	                     and from where, the cluster's shard count, replication and
//	                     retention, for each shard its file, applied index and term, size
//	                     and SHA-256, and the HMAC-SHA256 of all that with the backup key
//
// A shard file is written under a temporary name, synced, renamed into
// place and its directory synced (ShardWriter, through internal/durable),
// and the manifest the same way only after every shard file is in place
// (WriteManifest): a directory without manifest.json is a backup that did
// not finish, and Open refuses it by name.
//
// # Formats
//
// Format 2, which this build writes, added cluster_id and hmac_sha256.
// Format 1 has neither, so a format 1 backup is always unsigned; it is still
// read, and restores with --allow-unsigned. A manifest of format 1 that
// carries either field, or of a format after 2, is refused by number.
//
// # Signing
//
// The SHA-256 of each shard file says that the file is the one the manifest
// lists; the HMAC says that the manifest is the one chimectl backup wrote,
// so that nobody without the key can make a restore take other files or
// another cluster's shape. hmac_sha256 is the lower-case hex
// HMAC-SHA256, keyed with the backup key, of this canonical encoding of
// every other field of the manifest (signedBytes), in this order:
//
//	"chime backup manifest\n"   the 22 ASCII bytes, so that the HMAC of a manifest is
//	                            never that of anything else signed with the same key
//	format                      u64
//	cluster_id                  str
//	created                     i64 seconds since 1970-01-01T00:00:00Z, then u32
//	                            nanoseconds within the second (0 to 999,999,999)
//	source                      str
//	shard_count                 i64
//	replication                 i64
//	retention_ns                i64
//	number of shards listed     u64
//	each shard, in order        shard u64, file str, applied_index u64, applied_term u64,
//	                            size i64, sha256 str (its 64 hex digits), node str
//
// where u64 and i64 are 8 bytes big-endian (i64 in two's complement), u32
// is 4 bytes big-endian, and str is its length in bytes as a u64 followed
// by the UTF-8 bytes the JSON string decodes to. Each field has a fixed size
// or its length in front, so no two different manifests encode the same;
// created counts as its instant, in whatever zone the JSON writes it; a
// field added to the manifest takes a new Format and a place in the
// encoding. The signer computes the HMAC over the manifest as it reads
// back from its JSON (Manifest.Sign), the reader over what it decoded
// (Manifest.Verify, comparing in constant time).
//
// The backup key is the content of a file (--backup-key-file on chimectl
// backup and chimed restore; ReadKeyFile) with surrounding whitespace
// trimmed, used as it is: head -c 32 /dev/urandom | base64 makes one. A key
// shorter than 32 bytes is refused, and so is a file its group or others
// may read or write (whoever reads the key can sign a backup a restore
// trusts). A restore's rule (Authenticate): with a key, the manifest must
// carry an HMAC that verifies, so a manifest stripped of it is refused;
// without one, the backup is refused, signed or not, unless
// --allow-unsigned.
//
// # What it owns
//
//   - The manifest's fields and their rules (Manifest.check): a format this
//     build reads (Format; an unknown one is refused by number), at least
//     one shard, every shard from 0 to shard_count-1 listed exactly once
//     under its own file name (so a manifest cannot point outside DIR), a
//     64-hex-digit SHA-256 and HMAC, no negative size, replication or
//     retention.
//   - The canonical encoding, signing and checking the HMAC (Sign, Verify,
//     Authenticate), and reading the key (ReadKeyFile).
//   - Checking a shard file against the manifest (VerifyFile): it exists, has
//     the size the manifest says, and its SHA-256 matches, in one pass that
//     also hands the bytes to the caller's own check of the stream (chimed
//     restore runs raftfsm.VerifySnapshot there). Every error names the
//     directory, the file and the rule: "backup DIR: shard-002.snap: sha256
//     mismatch (manifest says X, file has Y)".
//   - Taking a backup (Take): the cluster map from one node, then each
//     shard's full stream through chime.v1.Admin/Backup (that node relays
//     the shards it does not lead) into its file, checked against the size
//     and SHA-256 the leader's summary states; a copy that breaks off
//     (UNAVAILABLE, ABORTED, no message within the timeout) is taken again
//     from the start, up to a number of retries; the manifest last, with
//     the cluster map's cluster id and, given a key, signed. How
//     progress is shown is the caller's (Options.Progress). chimectl's
//     backup tests run it against a fake Admin server that breaks copies
//     off, stalls and lies.
//
// # What it must never do
//
// It links none of Chime's server packages (raftfsm, shard, rpc): chimectl,
// a client, imports it, and speaks to a cluster only through the generated
// chime.v1 client; of Chime's own packages it imports only the client
// (client, proto/chime/v1) and internal/durable. It never exits the process
// or prints: errors go to the caller, progress to Options.Progress. What a
// stream means is raftfsm's to check; this package checks that the bytes are
// the ones the leader sent. It never changes a backup it reads, and it never
// leaves a shard file under its final name that was not completely written
// and synced. It never takes a manifest's HMAC for verified without the key,
// and never compares one but in constant time. What events a stream holds,
// and which topics they may target, is chimed restore's to check.
package backup
