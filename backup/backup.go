package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/chimehq/chime/internal/durable"
)

// Format is the manifest format this build writes. A change to the layout
// of the directory or to the meaning of a manifest field takes a new
// number. Format 2 added cluster_id and hmac_sha256; this build reads
// format 1 too, a backup that is always unsigned and names no cluster.
const Format = 2

// formatUnsigned is the format before manifests named their cluster and
// were signed, which this build still reads.
const formatUnsigned = 1

// ManifestName is the manifest's file name in a backup directory.
const ManifestName = "manifest.json"

// Manifest is manifest.json.
type Manifest struct {
	// Format is the manifest format (Format).
	Format int `json:"format"`
	// ClusterID is the id of the backed-up cluster (format 2 on; empty for
	// a cluster created before clusters had ids).
	ClusterID string `json:"cluster_id,omitempty"`
	// Created is when the backup finished (UTC).
	Created time.Time `json:"created"`
	// Source is the address of the node chimectl asked (informational).
	Source string `json:"source,omitempty"`
	// ShardCount, Replication and Retention are the backed-up cluster's,
	// fixed when it was created; a restored cluster takes them (retention
	// in nanoseconds, as cluster.json keeps it; 0 keeps settled events
	// forever).
	ShardCount  int           `json:"shard_count"`
	Replication int           `json:"replication"`
	Retention   time.Duration `json:"retention_ns"`
	// Shards lists every shard, in order.
	Shards []Shard `json:"shards"`
	// HMAC is the lower-case hex HMAC-SHA256, with the backup key, of
	// the canonical encoding of every other field (signedBytes); empty
	// in an unsigned manifest. It is the only field the encoding leaves
	// out.
	HMAC string `json:"hmac_sha256,omitempty"`
}

// Shard is one shard's entry in the manifest.
type Shard struct {
	Shard uint32 `json:"shard"`
	// File is the shard's file in the backup directory (FileName).
	File string `json:"file"`
	// AppliedIndex and AppliedTerm name the last Raft entry the copy holds,
	// as its stream's header does.
	AppliedIndex uint64 `json:"applied_index"`
	AppliedTerm  uint64 `json:"applied_term"`
	// Size is the file's length in bytes, SHA256 its digest in hex.
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Node is the leader the copy was taken from (informational).
	Node string `json:"node,omitempty"`
}

// FileName is the name of shard's file in a backup directory.
func FileName(shard uint32) string { return fmt.Sprintf("shard-%03d.snap", shard) }

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// check applies the manifest's rules; the error names the field.
func (m *Manifest) check() error {
	switch {
	case m.Format == 0:
		return errors.New("format: missing (a manifest of format 1 or later has it; this is not a Chime backup manifest)")
	case m.Format != Format && m.Format != formatUnsigned:
		return fmt.Errorf("format: %d, this build reads formats %d to %d (a backup made by a newer chimectl needs a chimed of that version)", m.Format, formatUnsigned, Format)
	case m.Format == formatUnsigned && (m.ClusterID != "" || m.HMAC != ""):
		return errors.New("format: 1 has no cluster_id or hmac_sha256 (they came with format 2)")
	case m.HMAC != "" && !hexDigest.MatchString(m.HMAC):
		return fmt.Errorf("hmac_sha256: %q is not 64 lower-case hex digits", m.HMAC)
	case m.ShardCount < 1:
		return fmt.Errorf("shard_count: %d, must be at least 1", m.ShardCount)
	case m.Replication < 1:
		return fmt.Errorf("replication: %d, must be at least 1", m.Replication)
	case m.Retention < 0:
		return fmt.Errorf("retention_ns: %d, must not be negative", m.Retention)
	case len(m.Shards) != m.ShardCount:
		return fmt.Errorf("shards: %d listed, shard_count is %d: every shard must be listed once", len(m.Shards), m.ShardCount)
	}
	for i, s := range m.Shards {
		switch {
		case s.Shard != uint32(i):
			return fmt.Errorf("shards[%d]: shard %d, want %d: shards are listed once each, in order", i, s.Shard, i)
		case s.File != FileName(s.Shard):
			return fmt.Errorf("shards[%d].file: %q, must be %q", i, s.File, FileName(s.Shard))
		case s.Size < 0:
			return fmt.Errorf("shards[%d].size: %d, must not be negative", i, s.Size)
		case !hexDigest.MatchString(s.SHA256):
			return fmt.Errorf("shards[%d].sha256: %q is not 64 lower-case hex digits", i, s.SHA256)
		}
	}
	return nil
}

// Error is an error about a backup directory, and the file in it when
// there is one.
type Error struct {
	Dir, File string
	Err       error
}

func (e *Error) Error() string {
	if e.File == "" {
		return fmt.Sprintf("backup %s: %v", e.Dir, e.Err)
	}
	return fmt.Sprintf("backup %s: %s: %v", e.Dir, e.File, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Open reads and checks dir's manifest.
func Open(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		if _, derr := os.Stat(dir); derr != nil {
			return nil, &Error{Dir: dir, Err: derr}
		}
		return nil, &Error{Dir: dir, Err: fmt.Errorf("no %s: not a backup, or one that did not finish (chimectl backup writes it last)", ManifestName)}
	}
	if err != nil {
		return nil, &Error{Dir: dir, Err: err}
	}
	m, err := decodeManifest(b)
	if err != nil {
		return nil, &Error{Dir: dir, File: ManifestName, Err: err}
	}
	return m, nil
}

// decodeManifest decodes a manifest and applies its rules. Unknown fields are
// ignored: a field that changes what a backup means comes with a new Format,
// which is refused.
func decodeManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// encodeManifest is the manifest.json of m, as WriteManifest writes it.
func encodeManifest(m *Manifest) ([]byte, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	return append(b, '\n'), err
}

// VerifyFile checks shard s's file in dir against the manifest: it exists,
// has s.Size bytes and their SHA-256 is s.SHA256. The same pass hands the
// bytes to check (nil: none), which must read r to its end; its error is
// reported after a size or digest mismatch, which says more plainly what
// went wrong.
func VerifyFile(dir string, s Shard, check func(r io.Reader) error) error {
	fail := func(err error) error { return &Error{Dir: dir, File: s.File, Err: err} }
	f, err := os.Open(filepath.Join(dir, s.File))
	if errors.Is(err, fs.ErrNotExist) {
		return fail(errors.New("missing (the manifest lists it)"))
	}
	if err != nil {
		return fail(err)
	}
	defer func() { _ = f.Close() }() // read only: a read error is what matters
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if fi.Size() != s.Size {
		return fail(fmt.Errorf("%d bytes, manifest says %d", fi.Size(), s.Size))
	}
	sum := sha256.New()
	r := io.TeeReader(f, sum)
	var checkErr error
	if check != nil {
		checkErr = check(r)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fail(err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != s.SHA256 {
		return fail(fmt.Errorf("sha256 mismatch (manifest says %s, file has %s)", s.SHA256, got))
	}
	if checkErr != nil {
		return fail(checkErr)
	}
	return nil
}

// WriteManifest checks m and writes it to dir, under a temporary name that
// is synced and renamed into place. chimectl backup calls it last, once
// every shard file is committed.
func WriteManifest(dir string, m *Manifest) error {
	if err := m.check(); err != nil {
		return &Error{Dir: dir, File: ManifestName, Err: err}
	}
	b, err := encodeManifest(m)
	if err != nil {
		return err
	}
	return durable.WriteFile(filepath.Join(dir, ManifestName), b, 0o600)
}

// ShardWriter writes one shard's file, counting and hashing it as it goes.
// Nothing appears under the file's name until Commit.
type ShardWriter struct {
	dir   string
	shard uint32
	f     *durable.File
	sum   hash.Hash
	size  int64
}

// CreateShard starts shard's file in dir.
func CreateShard(dir string, shard uint32) (*ShardWriter, error) {
	f, err := durable.Create(filepath.Join(dir, FileName(shard)), 0o600)
	if err != nil {
		return nil, err
	}
	return &ShardWriter{dir: dir, shard: shard, f: f, sum: sha256.New()}, nil
}

func (w *ShardWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.sum.Write(p[:n])
	w.size += int64(n)
	return n, err
}

// Size is how many bytes have been written.
func (w *ShardWriter) Size() int64 { return w.size }

// SHA256 is the digest of what has been written.
func (w *ShardWriter) SHA256() []byte { return w.sum.Sum(nil) }

// Commit syncs the file and puts it in place, and returns its manifest
// entry with the file, size and digest filled in.
func (w *ShardWriter) Commit() (Shard, error) {
	s := Shard{Shard: w.shard, File: FileName(w.shard), Size: w.size, SHA256: hex.EncodeToString(w.sum.Sum(nil))}
	if err := w.f.Commit(); err != nil {
		return Shard{}, &Error{Dir: w.dir, File: s.File, Err: err}
	}
	return s, nil
}

// Abort deletes the unfinished file.
func (w *ShardWriter) Abort() { w.f.Abort() }
