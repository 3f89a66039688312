package backup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeBackup writes a backup of n shards whose streams are content(i), as
// chimectl backup does, and returns its directory.
func writeBackup(t *testing.T, n int, content func(i int) []byte) string {
	t.Helper()
	dir := t.TempDir()
	m := &Manifest{Format: Format, Created: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), ShardCount: n, Replication: 3, Retention: 36 * time.Hour}
	for i := range n {
		w, err := CreateShard(dir, uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(content(i)); err != nil {
			t.Fatal(err)
		}
		s, err := w.Commit()
		if err != nil {
			t.Fatal(err)
		}
		s.AppliedIndex, s.AppliedTerm = uint64(100+i), 2
		m.Shards = append(m.Shards, s)
	}
	if err := WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	return dir
}

func stream(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("shard %d stream ", i)), 1000) }

// verifyAll opens dir and verifies every file, as chimed restore does.
func verifyAll(dir string) error {
	m, err := Open(dir)
	if err != nil {
		return err
	}
	for _, s := range m.Shards {
		if err := VerifyFile(dir, s, nil); err != nil {
			return err
		}
	}
	return nil
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one saying %q", parts)
	}
	var be *Error
	if !errors.As(err, &be) {
		t.Errorf("%v is not a *backup.Error", err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not say %q", err, p)
		}
	}
}

func TestWrittenBackupVerifies(t *testing.T) {
	dir := writeBackup(t, 3, stream)
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.ShardCount != 3 || m.Replication != 3 || m.Retention != 36*time.Hour || len(m.Shards) != 3 || m.Shards[2].File != "shard-002.snap" {
		t.Fatalf("manifest read back as %+v", m)
	}
	var seen []byte
	if err := VerifyFile(dir, m.Shards[1], func(r io.Reader) error {
		var err error
		seen, err = io.ReadAll(r)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(seen, stream(1)) {
		t.Fatalf("the check saw %d bytes, not the file's", len(seen))
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, n := range names {
		if strings.HasSuffix(n, ".tmp") {
			t.Errorf("temporary file left behind: %s", n)
		}
	}
	raw, _ := os.ReadFile(filepath.Join(dir, ManifestName))
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	for _, k := range []string{"format", "created", "shard_count", "replication", "retention_ns", "shards"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("manifest.json lacks %q:\n%s", k, raw)
		}
	}
}

func TestCorruptOrMissingShardFileIsRefusedByName(t *testing.T) {
	dir := writeBackup(t, 3, stream)
	path := filepath.Join(dir, "shard-002.snap")
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	wantErr(t, verifyAll(dir), "backup "+dir+": shard-002.snap: sha256 mismatch (manifest says ", ", file has ")

	if err := os.WriteFile(path, b[:len(b)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	wantErr(t, verifyAll(dir), "shard-002.snap: "+fmt.Sprint(len(b)-1)+" bytes, manifest says "+fmt.Sprint(len(b)))

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	wantErr(t, verifyAll(dir), "shard-002.snap: missing")
}

func TestCheckOfTheStreamIsReportedAfterTheDigest(t *testing.T) {
	dir := writeBackup(t, 1, stream)
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	bad := errors.New("snapshot of shard 7")
	// The check stops early: the digest still covers the whole file.
	err = VerifyFile(dir, m.Shards[0], func(r io.Reader) error { _, _ = io.CopyN(io.Discard, r, 10); return bad })
	wantErr(t, err, "shard-000.snap: snapshot of shard 7")
	if !errors.Is(err, bad) {
		t.Errorf("%v does not wrap the check's error", err)
	}
}

func TestManifestRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"a newer format", func(m map[string]any) { m["format"] = 3 }, "manifest.json: format: 3, this build reads formats 1 to 2"},
		{"format 1 naming a cluster", func(m map[string]any) { m["format"], m["cluster_id"] = 1, "c-1" }, "format: 1 has no cluster_id or hmac_sha256"},
		{"format 1 signed", func(m map[string]any) { m["format"], m["hmac_sha256"] = 1, strings.Repeat("0", 64) }, "format: 1 has no cluster_id or hmac_sha256"},
		{"a malformed hmac", func(m map[string]any) { m["hmac_sha256"] = "ABC" }, `hmac_sha256: "ABC" is not 64 lower-case hex digits`},
		{"no format", func(m map[string]any) { delete(m, "format") }, "manifest.json: format: missing"},
		{"no shards", func(m map[string]any) { m["shard_count"] = 0 }, "shard_count: 0, must be at least 1"},
		{"a shard missing", func(m map[string]any) { m["shards"] = m["shards"].([]any)[:2] }, "shards: 2 listed, shard_count is 3"},
		{"shards out of order", func(m map[string]any) {
			s := m["shards"].([]any)
			s[0], s[1] = s[1], s[0]
		}, "shards[0]: shard 1, want 0"},
		{"a file outside the directory", func(m map[string]any) {
			m["shards"].([]any)[1].(map[string]any)["file"] = "../shard-001.snap"
		}, `shards[1].file: "../shard-001.snap", must be "shard-001.snap"`},
		{"a malformed digest", func(m map[string]any) { m["shards"].([]any)[2].(map[string]any)["sha256"] = "abc" }, "shards[2].sha256"},
		{"negative retention", func(m map[string]any) { m["retention_ns"] = -1 }, "retention_ns: -1, must not be negative"},
		{"not JSON", nil, "manifest.json: invalid character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeBackup(t, 3, stream)
			path := filepath.Join(dir, ManifestName)
			raw, _ := os.ReadFile(path)
			if tc.edit == nil {
				raw = []byte("{not json")
			} else {
				var m map[string]any
				if err := json.Unmarshal(raw, &m); err != nil {
					t.Fatal(err)
				}
				tc.edit(m)
				raw, _ = json.Marshal(m)
			}
			if err := os.WriteFile(path, raw, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Open(dir)
			wantErr(t, err, "backup "+dir+": ", tc.want)
		})
	}
}

func TestUnfinishedBackupIsRefused(t *testing.T) {
	dir := t.TempDir()
	w, err := CreateShard(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(stream(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, FileName(0))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an uncommitted shard file is under its final name: %v", err)
	}
	w.Abort()
	if names, _ := os.ReadDir(dir); len(names) != 0 {
		t.Fatalf("Abort left %v", names)
	}
	_, err = Open(dir)
	wantErr(t, err, "no manifest.json: not a backup, or one that did not finish")
	_, err = Open(filepath.Join(dir, "nope"))
	wantErr(t, err, "no such file or directory")
}
