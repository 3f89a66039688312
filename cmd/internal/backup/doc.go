// Package backup is the on-disk format of a Chime backup, the directory
// `chimectl backup --out DIR` writes and `chimed restore --from DIR` reads,
// and the client that takes one (Take), which chimectl backup and
// chime-jepsen's periodic backups both run.
//
//	DIR/shard-000.snap   one file per shard: the shard's full snapshot stream as its
//	DIR/shard-001.snap   leader wrote it (chime.v1.Admin/Backup; the format is raftfsm's,
//	...                  with its own version, frame count and CRC-32C)
//	DIR/manifest.json    written last: the format version, when and from where, the
//	                     cluster's shard count, replication and retention, and for each
//	                     shard its file, applied index and term, size and SHA-256
//
// A shard file is written under a temporary name, synced and renamed into
// place (ShardWriter), and the manifest only after every shard file is in
// place (WriteManifest): a directory without manifest.json is a backup that
// did not finish, and Open refuses it by name.
//
// # What it owns
//
//   - The manifest's fields and their rules (Manifest.check): a format this
//     build reads (Format; an unknown one is refused by number), at least
//     one shard, every shard from 0 to shard_count-1 listed exactly once
//     under its own file name (so a manifest cannot point outside DIR), a
//     64-hex-digit SHA-256, no negative size, replication or retention.
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
//     from the start, up to a number of retries; the manifest last. How
//     progress is shown is the caller's (Options.Progress). chimectl's
//     backup tests run it against a fake Admin server that breaks copies
//     off, stalls and lies.
//
// # What it must never do
//
// It links none of Chime's server packages (raftfsm, shard, rpc): chimectl,
// a client, imports it, and speaks to a cluster only through the generated
// chime.v1 client. What a stream means is raftfsm's to check; this
// package checks that the bytes are the ones the leader sent. It never
// changes a backup it reads, and it never leaves a shard file under its
// final name that was not completely written and synced.
package backup
