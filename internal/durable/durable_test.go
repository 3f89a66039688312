package durable

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// step is one fsync as the test's fsync saw it: what was synced, and what
// the target held at that moment.
type step struct {
	dir    bool   // a directory, not the temporary file
	name   string // the synced file's or directory's path
	target string // the target's content then ("" when it does not exist)
}

func (s step) String() string {
	return fmt.Sprintf("{%s dir=%v target=%.12q}", s.name, s.dir, s.target)
}

// recordSyncs replaces fsync for the test with one that records every call
// (after the real sync) and returns fail's error for a file sync.
func recordSyncs(t *testing.T, target string, fail error) *[]step {
	t.Helper()
	var steps []step
	real := fsync
	fsync = func(f *os.File) error {
		fi, err := f.Stat()
		if err != nil {
			t.Errorf("stat of the synced %s: %v", f.Name(), err)
			return err
		}
		b, _ := os.ReadFile(target)
		steps = append(steps, step{dir: fi.IsDir(), name: f.Name(), target: string(b)})
		if err := real(f); err != nil {
			return err
		}
		if !fi.IsDir() {
			return fail
		}
		return nil
	}
	t.Cleanup(func() { fsync = real })
	return &steps
}

// tempFiles lists the temporary files left in dir.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(dir, "*.tmp"))
	if err != nil {
		t.Fatal(err)
	}
	return left
}

// WriteFile syncs the new content in its temporary file while the target
// still holds the old, renames it over the target, and only then syncs the
// target's directory; nothing temporary is left.
func TestWriteFileSyncsRenamesThenSyncsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	steps := recordSyncs(t, path, nil)
	content := strings.Repeat("new content ", 10000)
	if err := WriteFile(path, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
	if len(*steps) != 2 {
		t.Fatalf("%d syncs, want the temporary file's then the directory's: %v", len(*steps), *steps)
	}
	file, d := (*steps)[0], (*steps)[1]
	if file.dir || filepath.Dir(file.name) != dir || file.name == path || file.target != "old" {
		t.Errorf("first sync: %s (a directory: %v) with the target holding %.10q; want a temporary file in %s, synced before the rename", file.name, file.dir, file.target, dir)
	}
	if !d.dir || filepath.Clean(d.name) != dir {
		t.Errorf("second sync: %s (a directory: %v); want the directory %s", d.name, d.dir, dir)
	}
	if d.target != content {
		t.Errorf("the directory was synced with the target holding %.10q: it must be synced after the rename", d.target)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != content {
		t.Fatalf("the target holds %d bytes (%v), want the %d written", len(b), err, len(content))
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v (%v), want 0640", fi.Mode().Perm(), err)
	}
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// A file written as a stream appears under its name only at Commit, whole.
func TestCreateCommitsOnlyAtCommit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "shard-000.snap")
	steps := recordSyncs(t, path, nil)
	f, err := Create(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Abort()
	var want bytes.Buffer
	for i := range 100 {
		chunk := fmt.Appendf(nil, "frame %d\n", i)
		want.Write(chunk)
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the target exists before Commit: %v", err)
		}
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("the target holds %d bytes, want %d", len(b), want.Len())
	}
	if n := len(*steps); n != 2 || !(*steps)[1].dir {
		t.Errorf("syncs %v, want the file's then the directory's", *steps)
	}
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if err := f.Commit(); err == nil {
		t.Error("a second Commit succeeds")
	}
}

// A replacement that fails before the rename, or is aborted, leaves the old
// file as it was and no temporary file.
func TestFailedReplacementLeavesTheOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "removed.json")
	if err := os.WriteFile(path, []byte(`["old"]`), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		if b, err := os.ReadFile(path); err != nil || string(b) != `["old"]` {
			t.Errorf("%s: the target holds %q (%v), want the old content", what, b, err)
		}
		if left := tempFiles(t, dir); len(left) > 0 {
			t.Errorf("%s: temporary files left: %v", what, left)
		}
	}

	diskFull := errors.New("no space left on device")
	recordSyncs(t, path, diskFull)
	if err := WriteFile(path, []byte(`["old","new"]`), 0o600); !errors.Is(err, diskFull) {
		t.Errorf("WriteFile with a failing sync: %v, want %v", err, diskFull)
	}
	check("failing sync")

	f, err := Create(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(`["half`)); err != nil {
		t.Fatal(err)
	}
	f.Abort()
	check("abort")

	if err := WriteFile(filepath.Join(dir, "missing", "removed.json"), []byte("x"), 0o600); err == nil {
		t.Error("WriteFile into a missing directory succeeds")
	}
}

// Writers of one file at once each use their own temporary file: the file
// ends up holding one of their contents whole.
func TestConcurrentWritersDoNotMix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "peers.json")
	contents := make([]string, 8)
	for i := range contents {
		contents[i] = strings.Repeat(fmt.Sprint(i), 50000)
	}
	var wg sync.WaitGroup
	for _, c := range contents {
		wg.Go(func() {
			if err := WriteFile(path, []byte(c), 0o600); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range contents {
		found = found || string(b) == c
	}
	if !found {
		t.Errorf("the file holds %d bytes, none of the writers' whole content", len(b))
	}
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// SyncDir syncs the directory it is given, and fails on one that is not
// there.
func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	steps := recordSyncs(t, filepath.Join(dir, "none"), nil)
	if err := SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	if len(*steps) != 1 || !(*steps)[0].dir || (*steps)[0].name != dir {
		t.Errorf("syncs %v, want %s's", *steps, dir)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("SyncDir of a missing directory succeeds")
	}
}
