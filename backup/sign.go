package backup

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
)

// MinKeyBytes is the shortest backup key Sign and Verify take: 32 bytes,
// SHA-256's output, below which the key, not the hash, would bound how hard
// an HMAC is to forge.
const MinKeyBytes = 32

// maxKeyFileBytes bounds what ReadKeyFile reads: a key file is a line, and
// a path given by mistake (a backup's shard file) must not be read whole.
const maxKeyFileBytes = 64 << 10

// ReadKeyFile reads a backup key from path (chimectl backup and chimed
// restore --backup-key-file): the file's content with surrounding
// whitespace trimmed, used as it is (a base64 line is a key of its
// characters, not of the bytes it decodes to). It refuses a key shorter
// than MinKeyBytes, and, except on Windows, a file its group or others may
// read or write: whoever reads the key can sign a backup that a restore
// with it trusts, and whoever writes it can swap it for their own.
func ReadKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("backup key file: %w", err)
	}
	defer func() { _ = f.Close() }() // read only: a read error is what matters
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("backup key file: %w", err)
	}
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		return nil, fmt.Errorf("backup key file %s: mode %04o lets its group or others read or change it, and whoever reads the key can sign a backup that restore trusts: make it its owner's alone (chmod 600 %s)", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("backup key file %s: %w", path, err)
	}
	if len(b) > maxKeyFileBytes {
		return nil, fmt.Errorf("backup key file %s: more than %d bytes: a key file holds one key, a line", path, maxKeyFileBytes)
	}
	key := bytes.TrimSpace(b)
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("backup key file %s: a key of %d bytes (surrounding whitespace trimmed), and a key must be at least %d: make one with head -c 32 /dev/urandom | base64 > %s", path, len(key), MinKeyBytes, path)
	}
	return key, nil
}

func checkKey(key []byte) error {
	if len(key) < MinKeyBytes {
		return fmt.Errorf("a backup key of %d bytes, and a key must be at least %d", len(key), MinKeyBytes)
	}
	return nil
}

// signedMagic starts the signed bytes, so that the HMAC of a manifest is
// never also the HMAC of something else signed with the same key.
const signedMagic = "chime backup manifest\n"

// signedBytes is the canonical encoding of every field of m but HMAC: what
// the HMAC is taken over. In this order:
//
//	"chime backup manifest\n"   the 22 bytes of signedMagic
//	format                      u64
//	cluster_id                  str
//	created                     i64 seconds since 1970-01-01T00:00:00Z, then u32 nanoseconds
//	                            within the second (0 to 999,999,999)
//	source                      str
//	shard_count                 i64
//	replication                 i64
//	retention_ns                i64
//	number of shards listed     u64
//	each shard, in order        shard u64, file str, applied_index u64, applied_term u64,
//	                            size i64, sha256 str (the 64 hex digits), node str
//
// u64 and i64 are 8 bytes big-endian (i64 in two's complement), u32 is 4
// bytes big-endian, and str is its length in bytes as a u64 followed by
// those bytes, the UTF-8 that manifest.json's string decodes to. Every
// field has a fixed size or its length before it, so two manifests that
// differ in any field encode differently, and reordering or moving bytes
// between fields changes the encoding. created is the instant, whatever
// zone manifest.json writes it in.
func signedBytes(m *Manifest) []byte {
	b := []byte(signedMagic)
	u64 := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	i64 := func(v int64) { u64(uint64(v)) }
	str := func(s string) { u64(uint64(len(s))); b = append(b, s...) }
	u64(uint64(m.Format))
	str(m.ClusterID)
	i64(m.Created.Unix())
	b = binary.BigEndian.AppendUint32(b, uint32(m.Created.Nanosecond()))
	str(m.Source)
	i64(int64(m.ShardCount))
	i64(int64(m.Replication))
	i64(int64(m.Retention))
	u64(uint64(len(m.Shards)))
	for _, s := range m.Shards {
		u64(uint64(s.Shard))
		str(s.File)
		u64(s.AppliedIndex)
		u64(s.AppliedTerm)
		i64(s.Size)
		str(s.SHA256)
		str(s.Node)
	}
	return b
}

func manifestMAC(key []byte, m *Manifest) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(signedBytes(m))
	return h.Sum(nil)
}

// Sign sets m.HMAC to the HMAC-SHA256 of m with key. It first makes m what
// its manifest.json reads back as (JSON holds only valid UTF-8, and the
// instant of created), so that the HMAC a reader computes is the one
// written.
func (m *Manifest) Sign(key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if m.Format == formatUnsigned {
		return errors.New("format: 1 has no hmac_sha256 (format 2 on does)")
	}
	unsigned := *m
	unsigned.HMAC = ""
	b, err := json.Marshal(&unsigned)
	if err != nil {
		return err
	}
	var back Manifest
	if err := json.Unmarshal(b, &back); err != nil {
		return err
	}
	back.HMAC = hex.EncodeToString(manifestMAC(key, &back))
	*m = back
	return nil
}

// errUnsigned is Verify's error for a manifest without an HMAC.
var errUnsigned = errors.New("unsigned (no hmac_sha256)")

// Verify checks m's HMAC with key, in constant time: it fails for a
// manifest without one, and for one any field of which changed since it
// was signed, or that was signed with another key.
func (m *Manifest) Verify(key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if m.HMAC == "" {
		return errUnsigned
	}
	got, err := hex.DecodeString(m.HMAC)
	if err != nil || !hmac.Equal(got, manifestMAC(key, m)) {
		return errors.New("hmac_sha256 does not verify with the backup key: the manifest (a shard file's size or SHA-256, the shard list, the cluster id, any field) was changed after it was signed, or it was signed with another key")
	}
	return nil
}

// Authenticate applies chimed restore's rule to the manifest m of the
// backup in dir. With a key (--backup-key-file), the manifest must carry an
// HMAC that verifies with it, whatever allowUnsigned says: a manifest
// stripped of its HMAC is refused, not taken as unsigned. Without one, it
// is refused, signed or not, unless allowUnsigned (--allow-unsigned). The
// error names dir, manifest.json and the rule.
func Authenticate(dir string, m *Manifest, key []byte, allowUnsigned bool) error {
	fail := func(format string, a ...any) error {
		return &Error{Dir: dir, File: ManifestName, Err: fmt.Errorf(format, a...)}
	}
	switch {
	case key != nil:
		err := m.Verify(key)
		if errors.Is(err, errUnsigned) {
			return fail("%v, and a restore with --backup-key-file takes only a signed backup: this one was taken without chimectl backup --backup-key-file (restore it with --allow-unsigned instead of the key), or its hmac_sha256 was removed", err)
		}
		if err != nil {
			return fail("%w", err)
		}
		return nil
	case allowUnsigned:
		return nil
	case m.HMAC != "":
		return fail("signed (hmac_sha256), and no key to check it with: pass --backup-key-file with the key chimectl backup signed it with, or --allow-unsigned to restore it unchecked")
	default:
		return fail("%v: pass --backup-key-file to restore a signed backup, or --allow-unsigned to restore this one unchecked", errUnsigned)
	}
}
