package node

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/backup"
	"github.com/chimehq/chime/internal/durable"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/host"
)

// RestoreConfig says which backup to lay out as which new node.
type RestoreConfig struct {
	// From is the backup directory (chimectl backup --out).
	From string
	// DataDir is the new node's data directory. It must hold nothing yet
	// but the lock file chimed takes (chimed.lock).
	DataDir string
	// NodeID and RaftAddr are the node's id and its Raft address as the
	// others will know it: every shard's first configuration names them,
	// and Start refuses the directory under another id or Raft address.
	NodeID, RaftAddr string
	// Replication, when positive, is the new cluster's replication instead
	// of the backed-up cluster's.
	Replication int
	// Key is the backup key (chimed restore --backup-key-file): the
	// manifest must carry an HMAC that verifies with it, even with
	// AllowUnsigned. Without a key the backup is restored only with
	// AllowUnsigned (--allow-unsigned), signed or not, and an HMAC it
	// carries goes unchecked (backup.Authenticate).
	Key           []byte
	AllowUnsigned bool
	// Limits are the limits the node will run with, of which Restore uses
	// ReservedTopics (nil: DefaultLimits's) and AllowTopics: every event
	// and recurring schedule of the backup must target a topic they let
	// events target, because the node fires what it restores without the
	// checks the API makes.
	Limits rpc.Limits
	// Progress, when set, is told about each shard verified and laid out.
	Progress func(msg string)
	// Now stamps cluster.json's creation time (nil: time.Now).
	Now func() time.Time
}

// lockFileName is the lock chimed takes in a data directory; a restore
// takes it too, and it is all an empty data directory may hold.
const lockFileName = "chimed.lock"

// restoringName marks a data directory a restore is laying out; Start
// refuses one that has it.
const restoringName = "restore.incomplete"

// Restore makes cfg.DataDir the data directory of a new cluster's first node
// holding the backup in cfg.From. It first checks the whole backup: the
// manifest (format, shard count) and its HMAC (cfg.Key, cfg.AllowUnsigned),
// then every shard file's size and SHA-256 against it and its stream as a
// restore would (raftfsm.VerifySnapshotTargets: the shard, the applied
// index and term the manifest records, every frame, the checksum, the
// counters), and in the same pass every event's and recurring schedule's
// topic against the reserved topics of cfg.Limits, so a corrupt, forged,
// mismatched or forbidden backup is refused before anything is written. It
// then plants each shard's stream as the one Raft snapshot of the node's
// replica (shard.PlantSnapshot: this node the only voter), and writes
// cluster.json with the backup's shard count, replication and retention
// and a new cluster id.
//
// Started on the directory (Start, like any node with data), the node
// restores each shard into Pebble as its replica opens, elects itself, and
// fires every pending event: those that fell due since the backup at once.
// Other nodes join it as they join any cluster. While Restore runs the
// directory holds restore.incomplete, so that a node never starts on half
// of a backup.
func Restore(cfg RestoreConfig) (*backup.Manifest, error) {
	progress := cfg.Progress
	if progress == nil {
		progress = func(string) {}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NodeID == "" || cfg.RaftAddr == "" {
		return nil, errors.New("restore: the node id and the Raft address are required")
	}
	if err := checkEmpty(cfg.DataDir); err != nil {
		return nil, err
	}
	m, err := backup.Open(cfg.From)
	if err != nil {
		return nil, err
	}
	if err := backup.Authenticate(cfg.From, m, cfg.Key, cfg.AllowUnsigned); err != nil {
		return nil, err
	}
	progress(describeBackup(m, cfg.Key != nil))
	lim := cfg.Limits
	if lim.ReservedTopics == nil {
		lim.ReservedTopics = rpc.DefaultLimits().ReservedTopics
	}
	for _, s := range m.Shards {
		if err := backup.VerifyFile(cfg.From, s, func(r io.Reader) error { return checkStream(r, s, &lim) }); err != nil {
			return nil, err
		}
		progress(fmt.Sprintf("verified %s: shard %d at applied index %d, %d bytes", s.File, s.Shard, s.AppliedIndex, s.Size))
	}

	marker := filepath.Join(cfg.DataDir, restoringName)
	note := fmt.Sprintf("chimed restore --from %s began laying out this directory and did not finish.\nDelete everything here and run it again.\n", cfg.From)
	if err := os.WriteFile(marker, []byte(note), 0o600); err != nil {
		return nil, err
	}
	if err := durable.SyncDir(cfg.DataDir); err != nil {
		return nil, err
	}
	if err := layOut(cfg, m, progress); err != nil {
		// Undo what was laid out, so that the directory is empty again; if
		// that fails too, the marker stays and Start refuses the directory.
		// The error says so: the directory is then not the empty one a
		// refused restore leaves, and must be emptied by hand.
		undo := errors.Join(os.RemoveAll(filepath.Join(cfg.DataDir, "raft")), removeIfThere(metaPath(cfg.DataDir)))
		if undo == nil {
			undo = os.Remove(marker)
		}
		if undo != nil {
			return nil, errors.Join(err, fmt.Errorf("undoing the restore (%s stays): %w", marker, undo))
		}
		return nil, err
	}
	if err := os.Remove(marker); err != nil {
		return nil, err
	}
	return m, durable.SyncDir(cfg.DataDir)
}

// layOut plants every shard's snapshot and writes cluster.json.
func layOut(cfg RestoreConfig, m *backup.Manifest, progress func(string)) error {
	self := raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(cfg.NodeID), Address: raft.ServerAddress(cfg.RaftAddr)}
	raftDir := filepath.Join(cfg.DataDir, "raft")
	for _, s := range m.Shards {
		f, err := os.Open(filepath.Join(cfg.From, s.File))
		if err != nil {
			return err
		}
		sum := sha256.New()
		h := raftfsm.SnapshotHeader{Shard: s.Shard, AppliedIndex: s.AppliedIndex, AppliedTerm: s.AppliedTerm}
		err = shard.PlantSnapshot(host.ReplicaDir(raftDir, s.Shard), self, h, io.TeeReader(f, sum))
		_ = f.Close() // read only: a read error is what matters
		if err != nil {
			return err
		}
		// The file was verified a moment ago; this says it did not change
		// since.
		if got := hex.EncodeToString(sum.Sum(nil)); got != s.SHA256 {
			return &backup.Error{Dir: cfg.From, File: s.File, Err: fmt.Errorf("changed while it was restored (sha256 %s, manifest says %s)", got, s.SHA256)}
		}
		progress(fmt.Sprintf("laid out shard %d", s.Shard))
	}
	replication := m.Replication
	if cfg.Replication > 0 {
		replication = cfg.Replication
	}
	from, err := filepath.Abs(cfg.From)
	if err != nil {
		from = cfg.From
	}
	return saveMeta(cfg.DataDir, clusterMeta{
		ClusterID: newClusterID(), Shards: m.ShardCount, Replication: replication, Retention: m.Retention,
		NodeID: cfg.NodeID, RaftAddr: cfg.RaftAddr, Created: cfg.Now().UTC(), RestoredFrom: from,
	})
}

// describeBackup is the line a restore starts with: which cluster the
// backup is of, when it was taken, and how far its manifest was checked.
func describeBackup(m *backup.Manifest, keyed bool) string {
	cluster := "cluster " + m.ClusterID
	if m.ClusterID == "" {
		cluster = "a cluster with no id (a backup of format 1, or of a cluster created before clusters had ids)"
	}
	signed := "unsigned, restored with --allow-unsigned"
	switch {
	case keyed:
		signed = "signed, and its HMAC verified with the backup key"
	case m.HMAC != "":
		signed = "signed, and its HMAC not checked (--allow-unsigned, no --backup-key-file)"
	}
	return fmt.Sprintf("backup of %s: %d shards, taken %s; manifest %s", cluster, m.ShardCount, m.Created.Format(time.RFC3339), signed)
}

// checkStream checks one shard's stream as a restore will, that its header
// says what the manifest does, and that every event and recurring schedule
// in it targets a topic lim lets events target. A stream that does not
// verify is refused for that first, and a forbidden topic is named only
// once the whole stream has verified: the first one, and how many more.
func checkStream(r io.Reader, s backup.Shard, lim *rpc.Limits) error {
	var first raftfsm.SnapshotTarget
	var why string
	more := 0
	h, err := raftfsm.VerifySnapshotTargets(r, s.Shard, func(t raftfsm.SnapshotTarget) error {
		if w := lim.ReservedTopic(t.Topic); w != "" {
			if why == "" {
				first, why = t, w
			} else {
				more++
			}
		}
		return nil
	})
	switch {
	case err != nil && h.Format != 0 && !h.Reference && h.Shard != s.Shard:
		return fmt.Errorf("holds a copy of shard %d, not of shard %d", h.Shard, s.Shard)
	case err != nil:
		return err
	case h.AppliedIndex != s.AppliedIndex || h.AppliedTerm != s.AppliedTerm:
		return fmt.Errorf("the copy is at applied index %d (term %d), the manifest says %d (term %d)", h.AppliedIndex, h.AppliedTerm, s.AppliedIndex, s.AppliedTerm)
	case why != "":
		what := "event"
		if first.Schedule {
			what = "recurring schedule"
		}
		others := ""
		if more > 0 {
			others = fmt.Sprintf("; %d more events or schedules of the shard target reserved topics", more)
		}
		return fmt.Errorf("shard %d: %s %q targets the reserved topic %q: %s (--allow-topic %s restores it all the same)%s",
			s.Shard, what, first.ID, first.Topic, why, first.Topic, others)
	}
	return nil
}

// checkEmpty refuses a data directory that holds anything but chimed's lock
// file: a restore creates a new node and must not mix with another's data.
func checkEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.Name() != lockFileName {
			names = append(names, e.Name())
		}
	}
	if len(names) > 0 {
		return fmt.Errorf("data directory %s is not empty (it holds %s): a restore creates a new node, in a new or empty directory",
			dir, strings.Join(names[:min(len(names), 4)], ", "))
	}
	return nil
}

func removeIfThere(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
