package backup

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzManifest: manifest.json is read from a backup directory that may be damaged, edited or
// not a backup at all, before chimed restore lays anything out. decodeManifest never panics;
// what it accepts passes the manifest's rules, names only files of the form FileName gives
// (so none outside the directory), and WriteManifest writes it back as bytes that decode to
// the same manifest. Its HMAC verifies with the key only when it says what the one manifest
// signed with the key says (an HMAC the fuzzer made up does not verify); signed and written
// back, it verifies with the key and no other, and no longer once a field is changed.
func FuzzManifest(f *testing.F) {
	key := []byte("fuzz key of thirty-two bytes or more")
	sum := strings.Repeat("ab", 32)
	m := &Manifest{Format: Format, ClusterID: "c-0f3a", Created: time.Date(2026, 11, 3, 4, 5, 6, 7, time.UTC), Source: "10.0.0.1:7400",
		ShardCount: 2, Replication: 3, Retention: 7 * 24 * time.Hour, Shards: []Shard{
			{Shard: 0, File: FileName(0), AppliedIndex: 9, AppliedTerm: 2, Size: 1234, SHA256: sum, Node: "node-1"},
			{Shard: 1, File: FileName(1), Size: 0, SHA256: sum},
		}}
	b, err := encodeManifest(m)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	seed := *m
	if err := seed.Sign(key); err != nil {
		f.Fatal(err)
	}
	if b, err = encodeManifest(&seed); err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"format":1,"shard_count":1,"replication":1,"shards":[{"shard":0,"file":"shard-000.snap","sha256":"` + sum + `"}]}`))
	f.Add([]byte(`{"format":1,"shard_count":1,"replication":1,"shards":[{"shard":0,"file":"../shard-000.snap","sha256":"` + sum + `"}]}`))
	f.Add([]byte(`{"format":2,"hmac_sha256":"` + sum + `"}`))
	f.Add([]byte(`{"format":3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeManifest(b)
		if err != nil {
			return
		}
		if err := m.check(); err != nil {
			t.Fatalf("%q decodes to a manifest its rules refuse: %v", b, err)
		}
		for _, s := range m.Shards {
			if s.File != FileName(s.Shard) || strings.ContainsAny(s.File, `/\`) {
				t.Fatalf("%q names file %q for shard %d", b, s.File, s.Shard)
			}
		}
		if m.HMAC != "" && m.Verify(key) == nil && !bytes.Equal(signedBytes(m), signedBytes(&seed)) {
			t.Fatalf("%q verifies with the key, and says something else than the manifest signed with it", b)
		}
		again, err := encodeManifest(m)
		if err != nil {
			t.Fatalf("%q decodes to %+v, which does not encode: %v", b, m, err)
		}
		d, err := decodeManifest(again)
		if err != nil || !d.Created.Equal(m.Created) {
			t.Fatalf("%q decodes to %+v; written back, to %+v, %v", b, m, d, err)
		}
		d.Created, m.Created = time.Time{}, time.Time{}
		if !reflect.DeepEqual(d, m) {
			t.Fatalf("%q decodes to %+v; written back, to %+v", b, m, d)
		}
		if m.Format == formatUnsigned {
			return
		}
		if err := m.Sign(key); err != nil {
			t.Fatalf("%+v does not sign: %v", m, err)
		}
		signed, err := encodeManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		s, err := decodeManifest(signed)
		if err != nil || s.Verify(key) != nil || s.Verify(append([]byte("x"), key...)) == nil {
			t.Fatalf("%+v, signed and written back, reads as %+v (%v): it must verify with its key and no other", m, s, err)
		}
		s.Replication++
		if s.Verify(key) == nil {
			t.Fatalf("%+v verifies with its replication changed", s)
		}
	})
}
