package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/backup"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// fakeBackups answers Admin.Backup with canned shard streams, in messages of
// at most 1 MiB as the server sends them. breakOff[s] counts the attempts at
// shard s that end with UNAVAILABLE halfway, then stall[s] those that stop
// sending after the first message, noSum[s] those that end without the
// summary; lie[s] makes the summary's digest wrong.
type fakeBackups struct {
	fakeAdmin
	streams  [][]byte
	mu       sync.Mutex
	breakOff map[uint32]int
	noSum    map[uint32]int
	stall    map[uint32]int
	lie      map[uint32]bool
	asked    []uint32
}

func (f *fakeBackups) Backup(req *chimev1.BackupRequest, stream chimev1.Admin_BackupServer) error {
	f.mu.Lock()
	f.asked = append(f.asked, req.Shard)
	breakOff := f.breakOff[req.Shard] > 0
	f.breakOff[req.Shard]--
	noSum := f.noSum[req.Shard] > 0
	f.noSum[req.Shard]--
	stall := !breakOff && f.stall[req.Shard] > 0 // after the break-offs
	if stall {
		f.stall[req.Shard]--
	}
	f.mu.Unlock()
	if int(req.Shard) >= len(f.streams) {
		return status.Errorf(codes.InvalidArgument, "shard: %d is out of range", req.Shard)
	}
	data := f.streams[req.Shard]
	for off := 0; off < len(data); off += 1 << 20 {
		if breakOff && off >= len(data)/2 {
			return status.Error(codes.Unavailable, "shard 1: leadership lost (leadership is moving); retry in a moment")
		}
		if stall && off > 0 {
			<-stream.Context().Done()
			return stream.Context().Err()
		}
		if err := stream.Send(&chimev1.BackupChunk{Data: data[off:min(off+1<<20, len(data))]}); err != nil {
			return err
		}
	}
	if noSum {
		return nil
	}
	sum := sha256.Sum256(data)
	if f.lie[req.Shard] {
		sum[0] ^= 1
	}
	return stream.Send(&chimev1.BackupChunk{Summary: &chimev1.BackupSummary{Shard: req.Shard, AppliedIndex: 1000 + uint64(req.Shard),
		AppliedTerm: 4, Size: uint64(len(data)), Sha256: sum[:], Node: fmt.Sprintf("node-%d", req.Shard%3)}})
}

func newFakeBackups(sizes ...int) *fakeBackups {
	f := &fakeBackups{breakOff: map[uint32]int{}, noSum: map[uint32]int{}, stall: map[uint32]int{}, lie: map[uint32]bool{}}
	f.clusterMap = &chimev1.ClusterMap{ShardCount: uint32(len(sizes)), Replication: 3, Retention: durationpb.New(36 * time.Hour), ClusterId: "c-live"}
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range sizes {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		f.streams = append(f.streams, b)
	}
	return f
}

// chimectlSleepless runs chimectl with pauses that return at once.
func chimectlSleepless(t *testing.T, args ...string) result {
	t.Helper()
	return chimectlAt(t, &fakeClock{t: t0}, args...)
}

func TestBackupWritesEveryShardThenTheManifest(t *testing.T) {
	f := newFakeBackups(1000, 2<<20+5, 0)
	addr := startAdmin(t, f)
	out := filepath.Join(t.TempDir(), "b1")
	r := chimectl(t, nil, "", "--addr", addr, "backup", "--out", out)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if want := fmt.Sprintf("backed up 3 shards (2.0 MiB) of cluster c-live to %s in 0s\nrestore with: chimed restore --from %s --allow-unsigned --data-dir DIR --node-id ID --raft-addr HOST:PORT\n", out, out); r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
	// Without --backup-key-file the manifest is unsigned, and backup says
	// so in one line, last.
	if !strings.HasSuffix(r.stderr, "\nthe backup's manifest is unsigned (no --backup-key-file): restoring it will need chimed restore --allow-unsigned\n") {
		t.Errorf("stderr does not end saying the backup is unsigned:\n%s", r.stderr)
	}
	for _, want := range []string{
		"shard 0/3: 1000 B at applied index 1000, from node-0 (0s)\n",
		"shard 1/3: 2.0 MiB at applied index 1001, from node-1 (0s)\n",
		"shard 2/3: 0 B at applied index 1002, from node-2 (0s)\n",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("progress lacks %q:\n%s", want, r.stderr)
		}
	}
	m, err := backup.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	if m.ShardCount != 3 || m.Replication != 3 || m.Retention != 36*time.Hour || m.Source != addr || !m.Created.Equal(t0) ||
		m.ClusterID != "c-live" || m.HMAC != "" {
		t.Errorf("manifest %+v", m)
	}
	for i, s := range m.Shards {
		if err := backup.VerifyFile(out, s, nil); err != nil {
			t.Error(err)
		}
		b, _ := os.ReadFile(filepath.Join(out, s.File))
		if !bytes.Equal(b, f.streams[i]) || s.AppliedIndex != 1000+uint64(i) || s.AppliedTerm != 4 || s.Node != fmt.Sprintf("node-%d", i) {
			t.Errorf("shard %d: %d bytes, entry %+v", i, len(b), s)
		}
	}

	// --json prints the manifest.
	out2 := filepath.Join(t.TempDir(), "b2")
	r = chimectl(t, nil, "", "--addr", addr, "backup", "--out", out2, "--json")
	var got backup.Manifest
	if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil || len(got.Shards) != 3 || got.Format != backup.Format {
		t.Fatalf("--json: exit %d, %v:\n%s", r.code, err, r.stdout)
	}
}

// TestBackupWithAKeySignsTheManifest: with --backup-key-file the manifest
// names the cluster and carries an HMAC that verifies with the key, as
// chimed restore checks it, and with no other; a key file that is too
// short or that others may read is refused before anything is copied.
func TestBackupWithAKeySignsTheManifest(t *testing.T) {
	f := newFakeBackups(1000, 2<<20+5, 0)
	addr := startAdmin(t, f)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "backup.key")
	key := "bGV0IHRoaXMgYmUgYSBrZXkgb2YgdGhpcnR5LXR3byBieXRlcw=="
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "b1")
	r := chimectl(t, nil, "", "--addr", addr, "backup", "--out", out, "--backup-key-file", keyFile)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if want := fmt.Sprintf("backed up 3 shards (2.0 MiB) of cluster c-live to %s in 0s\nrestore with: chimed restore --from %s --backup-key-file KEYFILE --data-dir DIR --node-id ID --raft-addr HOST:PORT\n", out, out); r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
	if strings.Contains(r.stderr, "unsigned") {
		t.Errorf("a signed backup is said to be unsigned:\n%s", r.stderr)
	}
	m, err := backup.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	if m.ClusterID != "c-live" || len(m.HMAC) != 64 {
		t.Fatalf("manifest %+v", m)
	}
	if err := backup.Authenticate(out, m, []byte(key), false); err != nil {
		t.Fatalf("the manifest does not verify with the key of --backup-key-file: %v", err)
	}
	if err := backup.Authenticate(out, m, []byte(key+"x"), false); err == nil {
		t.Fatal("the manifest verifies with another key")
	}
	if err := backup.Authenticate(out, m, nil, false); err == nil || !strings.Contains(err.Error(), "signed (hmac_sha256), and no key to check it with") {
		t.Fatalf("a restore without the key: %v", err)
	}

	asked := len(f.asked)
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = chimectl(t, nil, "", "--addr", addr, "backup", "--out", filepath.Join(dir, "b2"), "--backup-key-file", short)
	r.want(t, 2, "", "chimectl backup: backup key file "+short+": a key of 10 bytes (surrounding whitespace trimmed), and a key must be at least 32: make one with head -c 32 /dev/urandom | base64 > "+short+"\nRun 'chimectl backup --help' for usage.\n")
	open := filepath.Join(dir, "open.key")
	if err := os.WriteFile(open, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	r = chimectl(t, nil, "", "--addr", addr, "backup", "--out", filepath.Join(dir, "b3"), "--backup-key-file", open)
	if r.code != 2 || !strings.Contains(r.stderr, "backup key file "+open+": mode 0644 lets its group or others read or change it") {
		t.Errorf("a key file others may read: exit %d, stderr %q", r.code, r.stderr)
	}
	if len(f.asked) != asked {
		t.Errorf("shards copied with a key refused: %v", f.asked[asked:])
	}
	for _, d := range []string{"b2", "b3"} {
		if _, err := os.Stat(filepath.Join(dir, d)); !os.IsNotExist(err) {
			t.Errorf("%s was created for a backup refused: %v", d, err)
		}
	}
}

func TestBackupRefusesADirectoryThatIsNotEmpty(t *testing.T) {
	f := newFakeBackups(10)
	addr := startAdmin(t, f)
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "manifest.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := chimectl(t, nil, "", "--addr", addr, "backup", "--out", out)
	r.want(t, 1, "", "chimectl: --out "+out+" is not empty (it holds manifest.json): back up into a new or empty directory\n")
	if len(f.asked) != 0 {
		t.Errorf("shards asked for: %v", f.asked)
	}
	chimectl(t, nil, "", "--addr", addr, "backup").want(t, 2, "",
		"chimectl backup: --out is required: the directory to write the backup into\nRun 'chimectl backup --help' for usage.\n")
}

func TestBackupCopiesAShardAgainThatBrokeOff(t *testing.T) {
	f := newFakeBackups(100, 3<<20, 100)
	f.breakOff[1] = 2
	f.stall[1] = 1
	f.noSum[2] = 1
	addr := startAdmin(t, f)
	out := filepath.Join(t.TempDir(), "b")
	r := chimectlSleepless(t, "--addr", addr, "backup", "--out", out, "--timeout", "300ms")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"shard 1/3: Unavailable: shard 1: leadership lost (leadership is moving); retry in a moment; copying it again (1 of 5)\n",
		"shard 1/3: Unavailable: shard 1: leadership lost (leadership is moving); retry in a moment; copying it again (2 of 5)\n",
		"shard 1/3: DeadlineExceeded: no data for 300ms (--timeout); copying it again (3 of 5)\n",
		"shard 2/3: Unavailable: the copy ended after 100 bytes without its summary; copying it again (1 of 5)\n",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if fmt.Sprint(f.asked) != "[0 1 1 1 1 2 2]" {
		t.Errorf("asked for shards %v", f.asked)
	}
	m, err := backup.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range m.Shards {
		if err := backup.VerifyFile(out, s, nil); err != nil {
			t.Error(err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(out, "*.tmp")); len(left) > 0 {
		t.Errorf("broken-off copies left behind: %v", left)
	}
}

func TestBackupThatFailsLeavesNoManifest(t *testing.T) {
	f := newFakeBackups(100, 100, 100)
	f.lie[1] = true
	addr := startAdmin(t, f)
	out := filepath.Join(t.TempDir(), "b")
	r := chimectlSleepless(t, "--addr", addr, "backup", "--out", out, "--retries", "1")
	want := fmt.Sprintf("chimectl: backup: shard 1: Aborted: received 100 bytes with sha256 %x, the leader sent 100 bytes with sha256 ", sha256.Sum256(f.streams[1]))
	if r.code != 1 || !strings.Contains(r.stderr, want) || !strings.HasSuffix(r.stderr, "; "+out+" has no manifest.json, so it is not a usable backup: delete it and run backup again\n") {
		t.Fatalf("exit %d, stderr:\n%s\nwant it to contain %q", r.code, r.stderr, want)
	}
	if _, err := backup.Open(out); err == nil || !strings.Contains(err.Error(), "no manifest.json") {
		t.Fatalf("the failed backup opens: %v", err)
	}
	if fmt.Sprint(f.asked) != "[0 1 1]" {
		t.Errorf("asked for shards %v, want shard 1 twice (--retries 1) and nothing after it", f.asked)
	}

	// A shard out of range is not retried.
	f = newFakeBackups(1)
	f.clusterMap.ShardCount = 2
	addr = startAdmin(t, f)
	r = chimectlSleepless(t, "--addr", addr, "backup", "--out", filepath.Join(t.TempDir(), "c"))
	if r.code != 1 || !strings.Contains(r.stderr, "chimectl: backup: shard 1: InvalidArgument: shard: 1 is out of range;") || fmt.Sprint(f.asked) != "[0 1]" {
		t.Fatalf("exit %d, asked %v, stderr:\n%s", r.code, f.asked, r.stderr)
	}
}

func TestByteSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 5 << 20: "5.0 MiB", 3<<30 + 1<<29: "3.5 GiB"} {
		if got := byteSize(n); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
	}
}
