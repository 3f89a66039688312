// Package durable replaces files so that a crash, power loss included,
// leaves either the old content or the whole new content under the name,
// never a mix or a truncated file, and so that the new content is on disk
// once the call returns. It is the one way Chime's packages write a file
// that must survive a restart: a data directory's cluster.json, removed.json
// and peers.json, a backup's shard files and manifest.json.
//
// A replacement takes four steps, and none can be left out:
//
//  1. The content goes to a new temporary file in the target's directory
//     (the rename below cannot cross file systems), named after the target
//     with a random part and ".tmp", so that two writers of one name never
//     share a temporary file.
//  2. The temporary file is synced: without it the rename can reach the disk
//     before the data, and a crash leaves the name on an empty or short file.
//  3. It is renamed over the target: a rename within a directory is atomic,
//     so a reader sees the old file or the new one.
//  4. The directory is synced: the rename is a change of the directory, and
//     until the directory is on disk a crash can bring the old file back.
//
// WriteFile does this for content in memory, Create and File.Commit for
// content written as a stream. SyncDir is step 4 alone, for callers that
// rename or remove entries themselves (a shard's released replica, a
// restore's marker file).
//
// # What it owns
//
//   - The order of the steps, and the temporary file's name and place.
//   - Cleaning up after itself: a replacement that fails before the rename
//     removes its temporary file and leaves the target as it was. Only a
//     crash can leave a temporary file behind (its name ends in ".tmp"); the
//     target is never touched by one.
//
// # What it must never do
//
//   - Put a name on content that is not complete and synced.
//   - Report success before the directory is synced. When only that last
//     step fails the target already holds the new content, but the error is
//     returned all the same: the caller cannot count on it after a crash.
//   - Know what the files mean: it imports nothing of Chime, so that every
//     package, the backup client included, can use it.
package durable
