package backup

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var (
	testKey  = []byte("0123456789abcdef0123456789abcdef0123456789ab") // 44 bytes, like a base64 line of 32
	otherKey = []byte("another key of at least thirty-two bytes......")
)

// writeSigned writes a backup as writeBackup does, with a cluster id and
// the manifest signed with key.
func writeSigned(t *testing.T, n int, key []byte) string {
	t.Helper()
	dir := writeBackup(t, n, stream)
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.ClusterID, m.Source = "c-7f3a", "10.0.0.1:7070"
	m.Shards[0].Node = "node-1"
	if err := m.Sign(key); err != nil {
		t.Fatal(err)
	}
	if err := WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	return dir
}

// editManifest rewrites dir's manifest.json through edit of its JSON.
func editManifest(t *testing.T, dir string, edit func(m map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, ManifestName)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	raw, _ = json.Marshal(m)
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSignedManifestVerifiesWithItsKeyOnly(t *testing.T) {
	dir := writeSigned(t, 3, testKey)
	raw, _ := os.ReadFile(filepath.Join(dir, ManifestName))
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if fields["cluster_id"] != "c-7f3a" || fields["format"] != float64(2) {
		t.Errorf("manifest.json:\n%s", raw)
	}
	mac, _ := fields["hmac_sha256"].(string)
	if len(mac) != 64 || strings.ToLower(mac) != mac {
		t.Fatalf("hmac_sha256 %q, want 64 lower-case hex digits", mac)
	}
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Verify(testKey); err != nil {
		t.Fatalf("the manifest does not verify with the key it was signed with: %v", err)
	}
	if err := Authenticate(dir, m, testKey, false); err != nil {
		t.Fatal(err)
	}
	if err := verifyAll(dir); err != nil {
		t.Fatal(err)
	}
	err = Authenticate(dir, m, otherKey, false)
	wantErr(t, err, "backup "+dir+": manifest.json: hmac_sha256 does not verify with the backup key")
	if err := Authenticate(dir, m, otherKey, true); err == nil {
		t.Error("--allow-unsigned lets a manifest through that does not verify with the key given")
	}
}

// TestTamperedManifestIsRefused: a change to any field of a signed
// manifest that its rules let through is caught by the HMAC.
func TestTamperedManifestIsRefused(t *testing.T) {
	shard := func(m map[string]any, i int) map[string]any { return m["shards"].([]any)[i].(map[string]any) }
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
	}{
		{"a file's size", func(m map[string]any) { shard(m, 1)["size"] = shard(m, 1)["size"].(float64) + 1 }},
		{"a file's sha256", func(m map[string]any) {
			shard(m, 2)["sha256"] = strings.Repeat("0", 64)
		}},
		{"the cluster id", func(m map[string]any) { m["cluster_id"] = "c-other" }},
		{"no cluster id", func(m map[string]any) { delete(m, "cluster_id") }},
		{"a shard dropped from the list", func(m map[string]any) {
			m["shards"], m["shard_count"] = m["shards"].([]any)[:2], 2
		}},
		{"two shards' entries swapped", func(m map[string]any) {
			a, b := shard(m, 0), shard(m, 1)
			for _, k := range []string{"size", "sha256", "applied_index"} {
				a[k], b[k] = b[k], a[k]
			}
		}},
		{"an applied index", func(m map[string]any) { shard(m, 0)["applied_index"] = 1 }},
		{"a node", func(m map[string]any) { shard(m, 0)["node"] = "node-2" }},
		{"the replication", func(m map[string]any) { m["replication"] = 1 }},
		{"the retention", func(m map[string]any) { m["retention_ns"] = 0 }},
		{"the creation time", func(m map[string]any) { m["created"] = "2026-03-01T12:00:01Z" }},
		{"the source", func(m map[string]any) { delete(m, "source") }},
		{"the hmac", func(m map[string]any) {
			b, _ := hex.DecodeString(m["hmac_sha256"].(string))
			b[31] ^= 1
			m["hmac_sha256"] = hex.EncodeToString(b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeSigned(t, 3, testKey)
			editManifest(t, dir, tc.edit)
			m, err := Open(dir)
			if err != nil {
				t.Fatalf("the edit breaks the manifest's rules (%v): it tests nothing about the HMAC", err)
			}
			wantErr(t, Authenticate(dir, m, testKey, false), "backup "+dir+": manifest.json: hmac_sha256 does not verify")
		})
	}

	// Removing the HMAC does not make a signed backup unsigned to a restore
	// given the key.
	dir := writeSigned(t, 3, testKey)
	editManifest(t, dir, func(m map[string]any) { delete(m, "hmac_sha256") })
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, Authenticate(dir, m, testKey, true), "manifest.json: unsigned (no hmac_sha256), and a restore with --backup-key-file takes only a signed backup")
}

// TestEveryFieldIsInTheSignedBytes changes each field of a manifest and of
// a shard entry in turn, whatever its type, and wants the signed bytes to
// change: a field added to Manifest or Shard and left out of signedBytes
// fails it.
func TestEveryFieldIsInTheSignedBytes(t *testing.T) {
	base := func() *Manifest {
		return &Manifest{Format: Format, ClusterID: "c", Created: time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC), Source: "s",
			ShardCount: 2, Replication: 3, Retention: time.Hour, Shards: []Shard{
				{Shard: 0, File: FileName(0), AppliedIndex: 4, AppliedTerm: 2, Size: 10, SHA256: strings.Repeat("a", 64), Node: "n"},
				{Shard: 1, File: FileName(1), AppliedIndex: 5, AppliedTerm: 2, Size: 11, SHA256: strings.Repeat("b", 64), Node: "n"},
			}}
	}
	want := string(signedBytes(base()))
	// bump changes v, whatever its kind, and says whether it knew how.
	bump := func(v reflect.Value) bool {
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Int, reflect.Int64:
			v.SetInt(v.Int() + 1)
		case reflect.Uint32, reflect.Uint64:
			v.SetUint(v.Uint() + 1)
		default:
			if tm, ok := v.Interface().(time.Time); ok {
				v.Set(reflect.ValueOf(tm.Add(time.Nanosecond)))
				return true
			}
			return false
		}
		return true
	}
	fields := 0
	mt := reflect.TypeFor[Manifest]()
	for i := range mt.NumField() {
		name := mt.Field(i).Name
		switch name {
		case "HMAC":
			continue
		case "Shards":
			st := reflect.TypeFor[Shard]()
			for j := range st.NumField() {
				for s := range 2 {
					m := base()
					if !bump(reflect.ValueOf(&m.Shards[s]).Elem().Field(j)) {
						t.Fatalf("Shard.%s: a %v, which the test does not know how to change", st.Field(j).Name, st.Field(j).Type)
					}
					if string(signedBytes(m)) == want {
						t.Errorf("shards[%d].%s is not in the signed bytes", s, st.Field(j).Name)
					}
				}
				fields++
			}
			m := base()
			m.Shards = m.Shards[:1]
			if string(signedBytes(m)) == want {
				t.Error("the number of shards listed is not in the signed bytes")
			}
			m = base()
			m.Shards[0], m.Shards[1] = m.Shards[1], m.Shards[0]
			if string(signedBytes(m)) == want {
				t.Error("the order of the shards is not in the signed bytes")
			}
			continue
		}
		m := base()
		if !bump(reflect.ValueOf(m).Elem().Field(i)) {
			t.Fatalf("Manifest.%s: a %v, which the test does not know how to change", name, mt.Field(i).Type)
		}
		if string(signedBytes(m)) == want {
			t.Errorf("%s is not in the signed bytes", name)
		}
		fields++
	}
	if fields != 7+7 {
		t.Errorf("%d fields changed; the test knows 7 of Manifest and 7 of Shard besides HMAC and Shards", fields)
	}
	// Bytes moved from one string to the next change the encoding too.
	m := base()
	m.ClusterID, m.Source = "cs", ""
	if string(signedBytes(m)) == want {
		t.Error("the cluster id and the source are not delimited")
	}
}

// TestSignedBytesAreTheDocumentedEncoding builds the canonical encoding of
// a manifest by hand, as doc.go lays it out, and pins the HMAC of it: a
// change to either would make every signed backup taken so far fail to
// verify.
func TestSignedBytesAreTheDocumentedEncoding(t *testing.T) {
	m := &Manifest{Format: 2, ClusterID: "c-1", Created: time.Date(2026, 3, 1, 12, 0, 0, 7, time.FixedZone("CET", 3600)),
		Source: "h:7070", ShardCount: 1, Replication: 3, Retention: 0, Shards: []Shard{
			{Shard: 0, File: "shard-000.snap", AppliedIndex: 9, AppliedTerm: 2, Size: 1234, SHA256: strings.Repeat("ab", 32), Node: "n1"},
		}}
	var b []byte
	u64 := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	str := func(s string) { u64(uint64(len(s))); b = append(b, s...) }
	b = append(b, "chime backup manifest\n"...)
	u64(2)
	str("c-1")
	u64(uint64(time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC).Unix()))
	b = binary.BigEndian.AppendUint32(b, 7)
	str("h:7070")
	u64(1)
	u64(3)
	u64(0)
	u64(1)
	u64(0)
	str("shard-000.snap")
	u64(9)
	u64(2)
	u64(1234)
	str(strings.Repeat("ab", 32))
	str("n1")
	if got := signedBytes(m); string(got) != string(b) {
		t.Fatalf("signed bytes\n%x\nwant\n%x", got, b)
	}
	if err := m.Sign(testKey); err != nil {
		t.Fatal(err)
	}
	// Computed apart from this package, with Python's hmac module over the
	// bytes above.
	const pinned = "2bb85b487f4d4b9d2be5366478a1789603dedc5aca869c84130999f0c6d86831"
	if m.HMAC != pinned {
		t.Errorf("HMAC %s, pinned %s", m.HMAC, pinned)
	}
}

func TestSignedManifestReadsBackAsSigned(t *testing.T) {
	// Bytes that are not UTF-8 are written to JSON as U+FFFD: the HMAC is
	// of what a reader decodes.
	dir := writeBackup(t, 1, stream)
	m, _ := Open(dir)
	m.Source, m.ClusterID = "bad \xff\xfe utf-8", "c-\x80"
	if err := m.Sign(testKey); err != nil {
		t.Fatal(err)
	}
	if err := WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	back, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := back.Verify(testKey); err != nil {
		t.Fatal(err)
	}
	if err := m.Verify(testKey); err != nil {
		t.Errorf("the signed manifest in memory does not verify: %v", err)
	}
}

func TestAuthenticateRule(t *testing.T) {
	signed := writeSigned(t, 1, testKey)
	unsigned := writeBackup(t, 1, stream)
	// A format 1 manifest, as the build before cluster ids and HMACs
	// wrote it.
	old := writeBackup(t, 1, stream)
	editManifest(t, old, func(m map[string]any) { m["format"] = 1 })
	for _, tc := range []struct {
		name          string
		dir           string
		key           []byte
		allowUnsigned bool
		want          string // "": accepted
	}{
		{"signed, with its key", signed, testKey, false, ""},
		{"signed, with another key", signed, otherKey, false, "hmac_sha256 does not verify with the backup key"},
		{"signed, no key", signed, nil, false, "manifest.json: signed (hmac_sha256), and no key to check it with: pass --backup-key-file with the key chimectl backup signed it with, or --allow-unsigned"},
		{"signed, no key, --allow-unsigned", signed, nil, true, ""},
		{"unsigned, no key", unsigned, nil, false, "manifest.json: unsigned (no hmac_sha256): pass --backup-key-file to restore a signed backup, or --allow-unsigned to restore this one unchecked"},
		{"unsigned, --allow-unsigned", unsigned, nil, true, ""},
		{"unsigned, with a key", unsigned, testKey, false, "manifest.json: unsigned (no hmac_sha256), and a restore with --backup-key-file takes only a signed backup"},
		{"unsigned, with a key and --allow-unsigned", unsigned, testKey, true, "unsigned (no hmac_sha256), and a restore with --backup-key-file"},
		{"format 1, --allow-unsigned", old, nil, true, ""},
		{"format 1, no key", old, nil, false, "unsigned (no hmac_sha256): pass --backup-key-file"},
		{"format 1, with a key", old, testKey, false, "unsigned (no hmac_sha256), and a restore with --backup-key-file"},
		{"a short key", signed, testKey[:31], false, "a backup key of 31 bytes, and a key must be at least 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Open(tc.dir)
			if err != nil {
				t.Fatal(err)
			}
			err = Authenticate(tc.dir, m, tc.key, tc.allowUnsigned)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, "backup "+tc.dir+": manifest.json: ", tc.want)
		})
	}
}

func TestSignAndVerifyRefuseAShortKey(t *testing.T) {
	m, err := Open(writeBackup(t, 1, stream))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Sign(testKey[:MinKeyBytes-1]); err == nil || !strings.Contains(err.Error(), "a backup key of 31 bytes, and a key must be at least 32") {
		t.Errorf("Sign with 31 bytes: %v", err)
	}
	if m.HMAC != "" {
		t.Error("a refused Sign signed")
	}
	if err := m.Sign(testKey[:MinKeyBytes]); err != nil {
		t.Errorf("Sign with 32 bytes: %v", err)
	}
	if err := m.Verify(nil); err == nil {
		t.Error("Verify without a key passes")
	}
	m.Format = formatUnsigned
	m.HMAC = ""
	if err := m.Sign(testKey); err == nil {
		t.Error("a format 1 manifest was signed")
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	key := string(testKey)
	p := write("good", "\n  "+key+"\n", 0o600)
	if got, err := ReadKeyFile(p); err != nil || string(got) != key {
		t.Fatalf("ReadKeyFile: %q, %v; want the content trimmed", got, err)
	}
	if got, err := ReadKeyFile(write("owner-read-only", key[:32], 0o400)); err != nil || len(got) != 32 {
		t.Errorf("32 bytes, mode 0400: %q, %v", got, err)
	}
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"short", key[:31] + "\n", 0o600, "a key of 31 bytes (surrounding whitespace trimmed), and a key must be at least 32: make one with head -c 32 /dev/urandom | base64 >"},
		{"blank", " \n\t\n", 0o600, "a key of 0 bytes"},
		{"group-readable", key, 0o640, "mode 0640 lets its group or others read or change it"},
		{"world-readable", key, 0o604, "mode 0604 lets its group or others read or change it"},
		{"group-writable", key, 0o620, "chmod 600"},
		{"huge", strings.Repeat("k", maxKeyFileBytes+1), 0o600, "a key file holds one key"},
	} {
		p := write(tc.name, tc.content, tc.mode)
		_, err := ReadKeyFile(p)
		if err == nil || !strings.Contains(err.Error(), "backup key file "+p+": ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %s and saying %q", tc.name, err, p, tc.want)
		}
	}
	if _, err := ReadKeyFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing file: %v", err)
	}
}
