package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
)

// TestSummaryShowsBursts: the summary line says how many bursts check 12 judged and skipped,
// and its count.
func TestSummaryShowsBursts(t *testing.T) {
	s := summary(checker.Results{Valid: false, BurstsChecked: 7, BurstsSkipped: 3, PriorityViolations: 2})
	if !strings.HasPrefix(s, "INVALID: ") ||
		!strings.Contains(s, "\nbursts: 7 checked, 3 skipped (a fault overlapped them, or nothing of them was acked or read back); priority_violations=2\n") {
		t.Errorf("summary:\n%s", s)
	}
}

// TestWhyEnded: a crash is reported by its panic line, from this process's part of a log
// that earlier processes of the node also wrote.
func TestWhyEnded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n1.log")
	earlier := "level=INFO msg=started\npanic: an earlier run's panic\n"
	now := "level=INFO msg=started\nlevel=ERROR msg=\"failed to get log\"\npanic: sealed segment has no index block\n\ngoroutine 1 [running]:\nmain.main()\n"
	if err := os.WriteFile(path, []byte(earlier+now), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := whyEnded(path, int64(len(earlier))); got != "panic: sealed segment has no index block" {
		t.Errorf("whyEnded = %q, want the panic line", got)
	}
	if err := os.WriteFile(path, []byte(earlier+"level=INFO msg=started\nlevel=ERROR msg=\"listen: address in use\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := whyEnded(path, int64(len(earlier))); got != `level=ERROR msg="listen: address in use"` {
		t.Errorf("whyEnded = %q, want the last line", got)
	}
}

// TestDeal: every kind is drawn once a round, and a run whose kinds include membership
// changes the membership first, so that CI's two-minute run always does.
func TestDeal(t *testing.T) {
	for seed := range uint64(20) {
		nm := &nemesis{kinds: faultKinds, r: newRand(seed, 7)}
		first := nm.deal(true)
		if first[0] != "membership" {
			t.Errorf("seed %d: the first round starts with %s", seed, first[0])
		}
		for _, round := range [][]string{first, nm.deal(false)} {
			got := slices.Sorted(slices.Values(round))
			if want := slices.Sorted(slices.Values(faultKinds)); !slices.Equal(got, want) {
				t.Fatalf("seed %d: a round draws %v, want every kind once", seed, round)
			}
		}
	}
}

// TestWhyEndedSaysTheDisk: a node that stops because its data directory cannot be written
// is reported by that line, though other goroutines logged after it, so that the checker
// can tell its exit from a crash.
func TestWhyEndedSaysTheDisk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n1.log")
	disk := `level=ERROR msg="` + checker.DiskExitLine + `: stopping so that other replicas lead this node's shards" err="shard 2: a Raft log append has been under way for 20s"`
	log := "level=INFO msg=started\n" + disk + "\nlevel=WARN msg=\"marking fired events\" shard=2\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := whyEnded(path, 0); got != disk {
		t.Errorf("whyEnded = %q, want the disk's line", got)
	}
}

// TestDiskImagePattern: leftovers are recognised by their image's name alone, deleted or
// not, and no other loop device is.
func TestDiskImagePattern(t *testing.T) {
	for back, want := range map[string]bool{
		"/tmp/jd-1/" + diskImageName(3):                   true,
		"/tmp/jd-1/" + diskImageName(12) + " (deleted)":   true,
		"/tmp/jd-1/" + diskImageName(2) + `\x20(deleted)`: true,
		"/var/lib/snapd/snaps/core_1.snap":                false,
		"/tmp/jd-1/chj-disk-n3.img.bak":                   false,
	} {
		if got := diskImagePattern.MatchString(back); got != want {
			t.Errorf("%q: %v, want %v", back, got, want)
		}
	}
	if got := unescapeMount(`/tmp/a\040b\134c`); got != `/tmp/a b\c` {
		t.Errorf("unescapeMount = %q", got)
	}
}
