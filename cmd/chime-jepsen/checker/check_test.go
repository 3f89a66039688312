package checker

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// violations are the counts that make a run invalid, by their results.json key.
func violations(res Results) map[string]int {
	return map[string]int{
		"lost":                       res.Lost,
		"early":                      res.Early,
		"cancel_violations":          res.CancelViolations,
		"phantom":                    res.Phantom,
		"idempotency_violations":     res.IdempotencyViolations,
		"expired_early":              res.ExpiredEarly,
		"resurrected":                res.Resurrected,
		"backup_lost":                res.BackupLost,
		"backup_phantom":             res.BackupPhantom,
		"backup_wrong_state":         res.BackupWrongState,
		"backup_invalid":             res.BackupInvalid,
		"update_violations":          res.UpdateViolations,
		"stale_reads":                res.StaleReads,
		"bulk_cancel_violations":     res.BulkCancelViolations,
		"recurring_missing":          res.RecurringMissing,
		"recurring_early":            res.RecurringEarly,
		"recurring_phantom":          res.RecurringPhantom,
		"recurring_after_stop":       res.RecurringAfterStop,
		"recurring_trigger_lost":     res.RecurringTriggerLost,
		"recurring_trigger_early":    res.RecurringTriggerEarly,
		"recurring_backfill_lost":    res.RecurringBackfillLost,
		"recurring_backfill_outside": res.RecurringBackfillOutside,
		"priority_violations":        res.PriorityViolations,
		"tenant_violations":          res.TenantViolations,
		"crashes":                    res.Crashes,
		"ingest_lost":                res.IngestLost,
		"ingest_after_tombstone":     res.IngestAfterTombstone,
		"ingest_after_replace":       res.IngestAfterReplace,
		"ingest_rejected":            res.IngestRejected,
	}
}

func assertClean(t *testing.T, res Results) {
	t.Helper()
	for k, n := range violations(res) {
		if n != 0 {
			t.Errorf("%s = %d, want 0; examples: %v", k, n, res.Examples[k])
		}
	}
	if !res.Converged || len(res.ConvergenceProblems) != 0 {
		t.Errorf("converged = %v, problems %v", res.Converged, res.ConvergenceProblems)
	}
	if !res.Valid {
		t.Errorf("valid = false on a clean run")
	}
}

// assertOnly checks that the run is invalid because of exactly one finding of check, about id.
func assertOnly(t *testing.T, res Results, check, id string) {
	t.Helper()
	if res.Valid {
		t.Errorf("valid = true, want false")
	}
	for k, n := range violations(res) {
		want := 0
		if k == check {
			want = 1
		}
		if n != want {
			t.Errorf("%s = %d, want %d; examples: %v", k, n, want, res.Examples[k])
		}
	}
	if !res.Converged {
		t.Errorf("converged = false: %v", res.ConvergenceProblems)
	}
	ex := res.Examples[check]
	if len(ex) != 1 || ex[0].ID != id {
		t.Fatalf("examples[%s] = %v, want one naming %s", check, ex, id)
	}
	t.Logf("%s: %s: %s", check, ex[0].ID, ex[0].Why)
}

func TestCleanHistoriesPass(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			g := genClean(seed, 800)
			res := g.check()
			assertClean(t, res)
			if res.Duplicates != 0 || res.EarlyUnderSkew != 0 || res.InvalidAccepted != 0 {
				t.Errorf("duplicates %d, early_under_skew %d, invalid_accepted %d; want 0",
					res.Duplicates, res.EarlyUnderSkew, res.InvalidAccepted)
			}
			// The run is not trivially clean: every scenario is there and was looked at.
			for _, sc := range scenarios {
				if len(g.ids[sc]) < 40 {
					t.Fatalf("scenario %s has %d ids", sc, len(g.ids[sc]))
				}
			}
			if dl := len(g.ids["deadletter"]) + len(g.ids["ingest_deadletter"]); res.Records != len(g.recs) || res.DeadLetterRecords != dl {
				t.Errorf("records %d (dead-letter %d), want %d (%d)", res.Records, res.DeadLetterRecords, len(g.recs), dl)
			}
			if res.Ops[FSchedule][TypeOK] == 0 || res.Ops[FSchedule][TypeInfo] == 0 || res.Ops[FSchedule][TypeFail] == 0 ||
				res.Ops[FNemesis][TypeInfo] != len(genWindows) {
				t.Errorf("op counts %v", res.Ops)
			}
			// Lists and bulk cancels of every kind were looked at.
			if res.Ops[FList][TypeOK] == 0 || res.Ops[FList][TypeInfo] == 0 || res.Ops[FCancelMatching][TypeOK] == 0 ||
				res.Ops[FCancelMatching][TypeInfo] == 0 || res.Ops[FCancelMatching][TypeFail] == 0 {
				t.Errorf("list and cancel_matching op counts %v, %v", res.Ops[FList], res.Ops[FCancelMatching])
			}
			if b := res.BulkCancels; b.Cancelled == 0 || b.SkippedHeld == 0 || b.SkippedFired == 0 ||
				b.Matched != b.Cancelled+b.SkippedFired+b.SkippedHeld {
				t.Errorf("bulk_cancels = %+v", b)
			}
			l := res.LatenessMs
			if l.Healthy.Count == 0 || l.Faulty.Count == 0 || l.AfterHeal.Count == 0 {
				t.Errorf("lateness periods %+v: each should have events", l)
			}
			// Healthy: up to 30 ms, dead-letter copies 300 ms more; faulty: until after the heal.
			if l.Healthy.Max > 330 || l.Healthy.P50 > 30 || l.Faulty.Max < 1000 {
				t.Errorf("lateness healthy p50 %v max %v (want <= 30, 330 ms), faulty max %v (want > 1 s)",
					l.Healthy.P50, l.Healthy.Max, l.Faulty.Max)
			}
			// One burst judged (q1, in priority order within the tolerance), one skipped (q2,
			// in no order, under the kill); neither in the lateness above.
			if res.BurstsChecked != 1 || res.BurstsSkipped != 1 || res.Bursts[0].Burst != "burst2" ||
				!strings.Contains(res.Bursts[0].Skipped, "kill") || res.Bursts[1].Judged != 30 {
				t.Errorf("bursts %+v", res.Bursts)
			}
			if len(res.Recovery) != len(genWindows) {
				t.Errorf("recovery has %d entries, want %d", len(res.Recovery), len(genWindows))
			}
			// The backups hold events in every state, and were all looked at.
			held := map[string]int{}
			for _, op := range g.ops {
				for _, st := range op.BackupEvents {
					held[st]++
				}
			}
			if res.Ops[FBackup][TypeOK] != 4 || res.Ops[FBackup][TypeFail] != 1 || len(held) != 4 || held[StateDeadLettered] < 10 {
				t.Errorf("backups %v hold states %v: want 4 ok and 1 failed, holding events in all four states", res.Ops[FBackup], held)
			}
		})
	}
}

func TestPlantLost(t *testing.T) {
	g := genClean(7, 650)
	id := g.pick("acked", nil)
	g.dropRecords(id)
	assertOnly(t, g.check(), "lost", id)
}

func TestPlantEarly(t *testing.T) {
	g := genClean(7, 650)
	id := g.pick("acked", g.awayFromFaults)
	g.recs[g.recsOf(id)[0]].AppendMs = g.due[id]/1e6 - 10
	assertOnly(t, g.check(), "early", id)
}

func TestPlantCancelAfterAck(t *testing.T) {
	g := genClean(7, 650)
	id := g.pick("cancel_before", g.awayFromFaults)
	s := g.ops[g.opsOf(id, FSchedule)[0]]
	g.recs = append(g.recs, Record{ID: id, Topic: s.Topic, Payload: s.Payload, Offset: 99999,
		DueMs: g.due[id] / 1e6, FiredMs: g.due[id]/1e6 + 4, Attempt: 1, AppendMs: g.due[id]/1e6 + 5})
	assertOnly(t, g.check(), "cancel_violations", id)
}

func TestPlantPhantomUnknownID(t *testing.T) {
	g := genClean(7, 650)
	g.recs = append(g.recs, Record{ID: "ghost-1", Topic: "reminders", Payload: "boo", Offset: 99999,
		DueMs: at(20*time.Second) / 1e6, AppendMs: at(20*time.Second) / 1e6, Attempt: 1})
	assertOnly(t, g.check(), "phantom", "ghost-1")
}

func TestPlantPhantomConflictingContent(t *testing.T) {
	g := genClean(7, 650)
	id := g.pick("acked_conflict", nil)
	ops := g.opsOf(id, FSchedule)
	rejected := g.ops[ops[1]]
	if rejected.Code != "AlreadyExists" {
		t.Fatalf("second schedule of %s is %+v", id, rejected)
	}
	g.recs[g.recsOf(id)[0]].Payload = rejected.Payload
	assertOnly(t, g.check(), "phantom", id)
}

func TestPlantIdempotency(t *testing.T) {
	cases := []struct {
		name, scenario, want string
		plant                func(g *run, id string)
	}{
		{"two creators", "acked_resend", "existing=false", func(g *run, id string) {
			g.ops[g.opsOf(id, FSchedule)[1]].Existing = false
		}},
		{"identical content, different due", "acked_resend", "different due times", func(g *run, id string) {
			g.ops[g.opsOf(id, FSchedule)[1]].AckDueNs += int64(time.Millisecond)
		}},
		{"existing=true with different content", "acked_resend", "different content", func(g *run, id string) {
			g.ops[g.opsOf(id, FSchedule)[1]].Payload += "-changed"
		}},
		{"records with different payloads", "info_conflict", "different payloads", func(g *run, id string) {
			second := g.ops[g.opsOf(id, FSchedule)[1]]
			first := g.recs[g.recsOf(id)[0]]
			first.Payload, first.Offset, first.AppendMs = second.Payload, 99999, first.AppendMs+3
			g.recs = append(g.recs, first)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(7, 650)
			id := g.pick(tc.scenario, nil)
			tc.plant(g, id)
			res := g.check()
			assertOnly(t, res, "idempotency_violations", id)
			if why := res.Examples["idempotency_violations"][0].Why; !strings.Contains(why, tc.want) {
				t.Errorf("example %q does not say %q", why, tc.want)
			}
		})
	}
}

// heldBy returns an id of scenario sc that backup dir holds in state, and whose schedule
// was acked before the backup was invoked.
func (g *run) heldBy(sc, dir, state string) string {
	b := g.backup(dir)
	return g.pick(sc, func(id string) bool {
		s := g.ops[g.opsOf(id, FSchedule)[0]]
		return b.BackupEvents[id] == state && s.Type == TypeOK && s.CompleteNs < b.InvokeNs
	})
}

func TestPlantBackupLost(t *testing.T) {
	for _, state := range []string{StateScheduled, StateFired, StateCancelled} {
		t.Run(state, func(t *testing.T) {
			g := genClean(7, 650)
			sc := map[string]string{StateScheduled: "acked", StateFired: "acked", StateCancelled: "cancel_before"}[state]
			id := g.heldBy(sc, "backup-002", state)
			delete(g.backup("backup-002").BackupEvents, id)
			assertOnly(t, g.check(), "backup_lost", id)
		})
	}
}

// TestBackupMayLackExpiredEvents: a backup may lack an acked event that settled at least the
// retention before it completed (less the skew of the windows in between), and no other.
func TestBackupMayLackExpiredEvents(t *testing.T) {
	// backup-005 completes at 91.5 s; genWindows' skew (3 s) is over by 53 s.
	settledAt := func(g *run, id string) int64 { return g.recs[g.recsOf(id)[0]].AppendMs * 1e6 }
	g := genClean(7, 650)
	b := g.backup("backup-005")
	old := g.pick("acked", func(id string) bool { // settled more than 30 s before, after the skew
		return len(g.recsOf(id)) > 0 && settledAt(g, id) > at(54*time.Second) && settledAt(g, id) < b.CompleteNs-int64(30*time.Second)
	})
	recent := g.pick("acked", func(id string) bool { // settled 10-20 s before
		s := settledAt(g, id)
		return len(g.recsOf(id)) > 0 && s > b.CompleteNs-int64(20*time.Second) && s < b.CompleteNs-int64(10*time.Second)
	})
	delete(b.BackupEvents, old)
	g.cfg.Retention = 30 * time.Second
	assertClean(t, g.check())
	delete(b.BackupEvents, recent)
	assertOnly(t, g.check(), "backup_lost", recent)
	g.cfg.Retention = 0 // off: nothing expires
	res := g.check()
	if res.BackupLost != 2 {
		t.Errorf("with the retention off, backup_lost = %d, want 2: %v", res.BackupLost, res.Examples["backup_lost"])
	}
}

func TestPlantBackupPhantom(t *testing.T) {
	cases := []struct {
		name  string
		plant func(g *run, b *Op) string
	}{
		{"an id never sent", func(g *run, b *Op) string { return "ghost-1" }},
		{"an id first sent after the backup", func(g *run, b *Op) string {
			return g.pick("acked", func(id string) bool { return g.ops[g.opsOf(id, FSchedule)[0]].InvokeNs > b.CompleteNs })
		}},
		{"an id whose only schedule failed before the backup", func(g *run, b *Op) string {
			return g.pick("failed", func(id string) bool { return g.ops[g.opsOf(id, FSchedule)[0]].InvokeNs < b.InvokeNs })
		}},
		{"the id of an invalid request", func(g *run, b *Op) string {
			for _, op := range g.ops {
				if op.F == FInvalid {
					return op.ID
				}
			}
			panic("no invalid op")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(7, 650)
			b := g.backup("backup-001")
			id := tc.plant(g, b)
			b.BackupEvents[id] = StateScheduled
			assertOnly(t, g.check(), "backup_phantom", id)
		})
	}
}

func TestPlantBackupWrongState(t *testing.T) {
	cases := []struct {
		name, want string
		plant      func(g *run, b *Op) string
	}{
		{"scheduled after an acked cancel", "a cancel of it was acked", func(g *run, b *Op) string {
			id := g.heldBy("cancel_before", b.Dir, StateCancelled)
			b.BackupEvents[id] = StateScheduled
			return id
		}},
		{"fired before any record", "no record of it reached its topic", func(g *run, b *Op) string {
			for _, id := range slices.Concat(g.ids["acked"], g.ids["acked_resend"], g.ids["cancel_after"]) {
				if b.BackupEvents[id] != "" && g.recs[g.recsOf(id)[0]].AppendMs*1e6 > b.CompleteNs+int64(time.Second) {
					b.BackupEvents[id] = StateFired // in the backup, due well after it
					return id
				}
			}
			panic("no event in " + b.Dir + " fired after it")
		}},
		{"cancelled with no cancel", "no ok or info cancel", func(g *run, b *Op) string {
			id := g.heldBy("acked", b.Dir, StateFired)
			b.BackupEvents[id] = StateCancelled
			return id
		}},
		{"dead-lettered with no dead-letter record", "dead-letter topic", func(g *run, b *Op) string {
			id := g.heldBy("acked", b.Dir, StateFired)
			b.BackupEvents[id] = StateDeadLettered
			return id
		}},
		{"fired, when it was dead-lettered", "no record of it reached its topic", func(g *run, b *Op) string {
			id := g.heldBy("deadletter", b.Dir, StateDeadLettered)
			b.BackupEvents[id] = StateFired
			return id
		}},
		{"no state", "no event state", func(g *run, b *Op) string {
			id := g.heldBy("acked", b.Dir, StateScheduled)
			b.BackupEvents[id] = "pending"
			return id
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(7, 650)
			id := tc.plant(g, g.backup("backup-002"))
			res := g.check()
			assertOnly(t, res, "backup_wrong_state", id)
			if why := res.Examples["backup_wrong_state"][0].Why; !strings.Contains(why, tc.want) {
				t.Errorf("example %q does not say %q", why, tc.want)
			}
		})
	}
}

func TestPlantBackupInvalid(t *testing.T) {
	cases := []struct {
		name, dir string
		plant     func(b *Op)
	}{
		{"ok, but unreadable", "backup-004", func(b *Op) {
			b.BackupReadError = "backup backup-004: shard-001.snap: sha256 mismatch"
			b.BackupEvents = nil // what the driver records when the directory does not read back
		}},
		{"ok, but no shards", "backup-004", func(b *Op) { b.BackupShards = nil }},
		{"failed, but left a manifest", "backup-003", func(b *Op) { b.LeftManifest = true }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(7, 650)
			tc.plant(g.backup(tc.dir))
			assertOnly(t, g.check(), "backup_invalid", tc.dir)
		})
	}
}

func TestPlantNotConverged(t *testing.T) {
	cases := []struct {
		name, want string
		plant      func(s *ShardState)
	}{
		{"two leaders", "2 leaders", func(s *ShardState) { s.Leaders = append(s.Leaders, s.Replicas[0].Node) }},
		{"no leader", "no leader", func(s *ShardState) { s.Leaders = nil }},
		{"digest mismatch", "digests differ", func(s *ShardState) { s.Replicas[1].Digest = "bad" }},
		{"applied index mismatch", "applied indexes differ", func(s *ShardState) { s.Replicas[2].AppliedIndex-- }},
		{"leader not a replica", "not one of its replicas", func(s *ShardState) { s.Leaders = []string{"n9"} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(3, 200)
			tc.plant(&g.final.Shards[2])
			res := g.check()
			if res.Valid || res.Converged {
				t.Errorf("valid %v converged %v, want both false", res.Valid, res.Converged)
			}
			for k, n := range violations(res) {
				if n != 0 {
					t.Errorf("%s = %d, want 0", k, n)
				}
			}
			p := res.ConvergenceProblems
			if len(p) != 1 || !strings.HasPrefix(p[0], "shard 2: ") || !strings.Contains(p[0], tc.want) {
				t.Fatalf("problems %q, want one about shard 2 saying %q", p, tc.want)
			}
		})
	}
	res := Check(nil, nil, Cluster{}, Config{})
	if res.Converged || res.Valid {
		t.Errorf("an empty final state converged")
	}
}

// TestPlantCrash: a node whose process ended by itself makes the run invalid, though every
// event was delivered and the replicas agree.
func TestPlantCrash(t *testing.T) {
	g := genClean(3, 200)
	g.final.Crashes = []Crash{{Node: "n2", AtNs: g.ops[0].InvokeNs, Exit: "exit status 2",
		Line: "panic: sealed segment has no index block [recovered, repanicked]"}}
	res := g.check()
	if res.Valid || res.Crashes != 1 || !res.Converged {
		t.Fatalf("valid %v crashes %d converged %v, want false 1 true", res.Valid, res.Crashes, res.Converged)
	}
	ex := res.Examples["crashes"]
	if len(ex) != 1 || ex[0].ID != "n2" || !strings.Contains(ex[0].Why, "exit status 2") || !strings.Contains(ex[0].Why, "sealed segment") {
		t.Fatalf("examples %+v, want n2's exit and its panic", ex)
	}
}

// TestPlantFormatRefusal: in an upgrade run, the old build stopping on a Raft entry of a
// kind it does not know is the refusal it owes (counted, the run valid); the same line from
// the current build, or any other end of the old build, is a crash.
func TestPlantFormatRefusal(t *testing.T) {
	const refusal = "panic: raftfsm: shard 3: log entry 812 (term 2) cannot be applied: raftfsm: malformed command: Recurring: op: unknown op 6"
	for _, tc := range []struct {
		name              string
		crash             Crash
		crashes, refusals int
	}{
		{"old build refuses an unknown op", Crash{Node: "n2", Build: "old", Exit: "exit status 2", Line: refusal}, 0, 1},
		{"old build refuses an unknown body format", Crash{Node: "n2", Build: "old", Exit: "exit status 2",
			Line: "panic: raftfsm: shard 1: read for fire: body: format: unknown body format 5"}, 0, 1},
		{"the current build may not refuse", Crash{Node: "n2", Build: "new", Exit: "exit status 2", Line: refusal}, 1, 0},
		{"a run without upgrades may not refuse", Crash{Node: "n2", Exit: "exit status 2", Line: refusal}, 1, 0},
		{"old build's truncated entry is a crash", Crash{Node: "n2", Build: "old", Exit: "exit status 2",
			Line: "panic: raftfsm: shard 3: log entry 812 (term 2) cannot be applied: raftfsm: malformed command: Recurring: id: truncated"}, 1, 0},
		{"old build's other panic is a crash", Crash{Node: "n2", Build: "old", Exit: "exit status 2",
			Line: "panic: sealed segment has no index block [recovered, repanicked]"}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(3, 200)
			tc.crash.AtNs = g.ops[0].InvokeNs
			g.final.Crashes = []Crash{tc.crash}
			res := g.check()
			if res.Crashes != tc.crashes || res.FormatRefusals != tc.refusals || res.Valid != (tc.crashes == 0) || !res.Converged {
				t.Fatalf("crashes %d format_refusals %d valid %v converged %v, want %d %d %v true",
					res.Crashes, res.FormatRefusals, res.Valid, res.Converged, tc.crashes, tc.refusals, tc.crashes == 0)
			}
			if tc.refusals == 1 && (len(res.Examples["format_refusals"]) != 1 || !strings.Contains(res.Examples["format_refusals"][0].Why, "unknown")) {
				t.Fatalf("examples %+v, want the refusal's line", res.Examples["format_refusals"])
			}
		})
	}
}

// TestPlantCrashInDiskFault: a node that stops saying its data directory cannot be written,
// inside a disk fault on it or just after its heal, stopped as chimed must (disk_exits);
// every other exit is still a crash: a panic in the window, the disk's line from a node the
// fault did not touch, long after the heal, or in a window of another kind.
func TestPlantCrashInDiskFault(t *testing.T) {
	diskLine := `level=ERROR msg="` + DiskExitLine + `: stopping so that other replicas lead this node's shards" err="shard 3: a Raft log append has been under way for 20s"`
	base := genClean(3, 200).ops[0].InvokeNs
	start, heal := base+int64(40*time.Second), base+int64(55*time.Second)
	windows := []Op{
		{F: FNemesis, Type: TypeOK, Kind: "disk-stall", Targets: []string{"n2"}, InvokeNs: start, CompleteNs: heal},
		{F: FNemesis, Type: TypeOK, Kind: "disk-full", Targets: []string{"n4"}, InvokeNs: start, CompleteNs: heal},
		{F: FNemesis, Type: TypeOK, Kind: "pause", Targets: []string{"n5"}, InvokeNs: start, CompleteNs: heal},
	}
	for _, tc := range []struct {
		name    string
		crash   Crash
		excused bool
	}{
		{"stall, in the window", Crash{Node: "n2", AtNs: start + int64(20*time.Second), Line: diskLine}, true},
		{"stall, just after the heal", Crash{Node: "n2", AtNs: heal + int64(DiskExitGrace) - 1, Line: diskLine}, true},
		{"full, in the window", Crash{Node: "n4", AtNs: heal - 1, Line: diskLine}, true},
		{"a panic in the window", Crash{Node: "n2", AtNs: start + 1, Line: "panic: runtime error: index out of range"}, false},
		{"a node the fault did not touch", Crash{Node: "n3", AtNs: start + 1, Line: diskLine}, false},
		{"before the window", Crash{Node: "n2", AtNs: start - 1, Line: diskLine}, false},
		{"long after the heal", Crash{Node: "n2", AtNs: heal + int64(DiskExitGrace) + 1, Line: diskLine}, false},
		{"in a window of another kind", Crash{Node: "n5", AtNs: start + 1, Line: diskLine}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(3, 200)
			for _, w := range windows {
				w.Index = len(g.ops)
				g.ops = append(g.ops, w)
			}
			tc.crash.Exit = "exit status 1"
			g.final.Crashes = []Crash{tc.crash}
			res := g.check()
			if tc.excused {
				if !res.Valid || res.Crashes != 0 || res.DiskExits != 1 || len(res.Examples["disk_exits"]) != 1 {
					t.Fatalf("valid %v crashes %d disk_exits %d, want true 0 1; examples %v", res.Valid, res.Crashes, res.DiskExits, res.Examples)
				}
				return
			}
			if res.Valid || res.Crashes != 1 || res.DiskExits != 0 {
				t.Fatalf("valid %v crashes %d disk_exits %d, want false 1 0", res.Valid, res.Crashes, res.DiskExits)
			}
		})
	}
}

// event returns an acked schedule due at due and its record appended late after due, with
// exact millisecond times so that lateness is known exactly.
func event(id string, due, late time.Duration) (Op, Record) {
	d := at(due)
	op := Op{F: FSchedule, ID: id, Topic: "t", Payload: "p-" + id, DeliverAtNs: d, Type: TypeOK, AckDueNs: d,
		InvokeNs: d - int64(time.Second), CompleteNs: d - int64(time.Second) + 1e6}
	rec := Record{ID: id, Topic: "t", Payload: "p-" + id, DueMs: d / 1e6, Attempt: 1, AppendMs: (d + int64(late)) / 1e6}
	return op, rec
}

func TestDuplicatesAttributedToFault(t *testing.T) {
	g := genClean(5, 300)
	copies := map[string]time.Duration{ // id → when its extra copy lands
		"dup-kill":      12 * time.Second,         // inside kill [10, 14]
		"dup-partition": 40 * time.Second,         // partition healed at 35: within the 10 s grace
		"dup-skew":      56 * time.Second,         // skew healed at 53
		"dup-kafka":     71 * time.Second,         // inside kafka [70, 72] and pause's grace: the later start wins
		"dup-none":      95 * time.Second,         // kafka's grace ended at 82
		"dup-none2":     24500 * time.Millisecond, // kill's grace ended at 24, partition starts at 25
		"dup-boundary":  45 * time.Second,         // partition heal + grace exactly: still the partition's
		"dup-dlq":       12500 * time.Millisecond,
	}
	for id, when := range copies {
		op, rec := event(id, 5*time.Second, 20*time.Millisecond)
		g.addAcked(op, rec)
		rec.AppendMs = at(when) / 1e6
		rec.Offset = 1
		if id == "dup-dlq" {
			rec.Topic = DefaultDeadLetterTopic
		}
		if id == "dup-kafka" || id == "dup-none" {
			rec.Attempt++ // a produce sent again after one its leader could not confirm
		}
		g.recs = append(g.recs, rec)
	}
	res := g.check()
	assertClean(t, res)
	want := map[string]int{"kill": 2, "partition": 2, "skew": 1, "pause": 0, "kafka": 1, "none": 2}
	if fmt.Sprint(res.DuplicatesByFault) != fmt.Sprint(want) {
		t.Errorf("duplicates_by_fault = %v, want %v", res.DuplicatesByFault, want)
	}
	if want := map[string]int{"refired": 6, "retried": 2}; fmt.Sprint(res.DuplicatesByStep) != fmt.Sprint(want) {
		t.Errorf("duplicates_by_step = %v, want %v", res.DuplicatesByStep, want)
	}
	if res.Duplicates != len(copies) {
		t.Errorf("duplicates = %d, want %d", res.Duplicates, len(copies))
	}
}

func TestEarlyUnderSkew(t *testing.T) {
	// genWindows' skew: [48 s, 53 s], clock moved by 3 s.
	cases := []struct {
		name       string
		due, early time.Duration
		underSkew  bool
	}{
		{"due inside the window", 50 * time.Second, time.Second, true},
		{"appended inside the window, due after it", 54500 * time.Millisecond, 2500 * time.Millisecond, true},
		{"appended just after the heal, due after it", 56 * time.Second, 2990 * time.Millisecond, true},
		{"earlier than the skew explains", 50 * time.Second, 3500 * time.Millisecond, false},
		{"nowhere near the window", 42 * time.Second, time.Second, false},
		{"clock moved back", 50 * time.Second, time.Second, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(9, 300)
			if tc.name == "clock moved back" {
				for i := range g.ops {
					if g.ops[i].Kind == KindSkew {
						g.ops[i].SkewNs = -g.ops[i].SkewNs
					}
				}
			}
			op, rec := event("early-1", tc.due, -tc.early)
			g.addAcked(op, rec)
			res := g.check()
			if tc.underSkew {
				if res.EarlyUnderSkew != 1 || res.Early != 0 || !res.Valid {
					t.Fatalf("early_under_skew %d, early %d, valid %v; want 1, 0, true", res.EarlyUnderSkew, res.Early, res.Valid)
				}
				if ex := res.Examples["early_under_skew"]; len(ex) != 1 || ex[0].ID != "early-1" {
					t.Errorf("examples %v", ex)
				}
				return
			}
			if res.EarlyUnderSkew != 0 {
				t.Errorf("early_under_skew = %d, want 0", res.EarlyUnderSkew)
			}
			assertOnly(t, res, "early", "early-1")
		})
	}
}

func TestToleranceBoundaries(t *testing.T) {
	op, rec := event("b", 10*time.Second, -2*time.Millisecond) // exactly EarlyTolerance early
	res := Check([]Op{op}, []Record{rec}, cleanCluster(1), Config{})
	assertClean(t, res)
	rec.AppendMs--
	res = Check([]Op{op}, []Record{rec}, cleanCluster(1), Config{})
	assertOnly(t, res, "early", "b")
	res = Check([]Op{op}, []Record{rec}, cleanCluster(1), Config{EarlyTolerance: 5 * time.Millisecond})
	assertClean(t, res)

	// Due from the ack wins over the record's header.
	op, rec = event("h", 10*time.Second, time.Millisecond)
	rec.DueMs -= 1000
	rec.AppendMs -= 500
	assertOnly(t, Check([]Op{op}, []Record{rec}, cleanCluster(1), Config{}), "early", "h")

	// Cancel: an append in the millisecond of the ack is not provably after it.
	op, rec = event("c", 10*time.Second, 5*time.Millisecond)
	cancel := Op{F: FCancel, ID: "c", Type: TypeOK, InvokeNs: rec.AppendMs*1e6 - 3e6, CompleteNs: rec.AppendMs * 1e6}
	assertClean(t, Check([]Op{op, cancel}, []Record{rec}, cleanCluster(1), Config{}))
	cancel.CompleteNs--
	assertOnly(t, Check([]Op{op, cancel}, []Record{rec}, cleanCluster(1), Config{}), "cancel_violations", "c")
	assertClean(t, Check([]Op{op, cancel}, []Record{rec}, cleanCluster(1), Config{CancelTolerance: time.Nanosecond}))

	// Lost: a failed cancel does not excuse a missing record; an info one does.
	cancel = Op{F: FCancel, ID: "c", Type: TypeFail, Code: "FailedPrecondition"}
	assertOnly(t, Check([]Op{op, cancel}, nil, cleanCluster(1), Config{}), "lost", "c")
	cancel.Type = TypeInfo
	assertClean(t, Check([]Op{op, cancel}, nil, cleanCluster(1), Config{}))
}

func TestLatenessAndRecovery(t *testing.T) {
	ops := []Op{{F: FNemesis, Kind: "kill", Targets: []string{"n1"}, InvokeNs: at(100 * time.Second), CompleteNs: at(110 * time.Second)}}
	var recs []Record
	add := func(id string, due, late time.Duration) {
		op, rec := event(id, due, late)
		ops = append(ops, op)
		recs = append(recs, rec)
	}
	// Healthy: lateness 1..100 ms.
	for i := range 100 {
		add(fmt.Sprintf("h%03d", i), 10*time.Second+time.Duration(i)*500*time.Millisecond, time.Duration(i+1)*time.Millisecond)
	}
	recs[0].DueMs = 0 // the acked due is used, not the header
	// A late duplicate of a healthy event is not its lateness.
	dup := recs[5]
	dup.AppendMs += 5000
	dup.Offset = 7
	recs = append(recs, dup)
	// Faulty: due inside [100 s, 110 s].
	add("f1", 101*time.Second, 1000*time.Millisecond)
	add("f2", 105*time.Second, 2000*time.Millisecond)
	add("f3", 109*time.Second, 3000*time.Millisecond)
	// After the heal (FinalHealNs defaults to the last heal, 110 s).
	add("a1", 120*time.Second, 5*time.Millisecond)
	add("a2", 130*time.Second, 7*time.Millisecond)

	res := Check(ops, recs, cleanCluster(1), Config{})
	assertClean(t, res)
	want := Lateness{
		Healthy:   Quantiles{Count: 100, P50: 50, P99: 99, Max: 100},
		Faulty:    Quantiles{Count: 3, P50: 2000, P99: 3000, Max: 3000},
		AfterHeal: Quantiles{Count: 2, P50: 5, P99: 7, Max: 7},
	}
	if res.LatenessMs != want {
		t.Errorf("lateness_ms = %+v\nwant          %+v", res.LatenessMs, want)
	}
	if res.Config.FinalHealNs != at(110*time.Second) {
		t.Errorf("final heal %d, want the kill's heal", res.Config.FinalHealNs)
	}
	// f3, due at 109 s, reached Kafka at 112 s: two seconds after the heal.
	if len(res.Recovery) != 1 || res.Recovery[0].RecoveryMs != 2000 || res.Recovery[0].Kind != "kill" {
		t.Errorf("recovery = %+v, want kill 2000 ms", res.Recovery)
	}
	if res.Duplicates != 1 || res.DuplicatesByFault["none"] != 1 {
		t.Errorf("duplicates %d by fault %v", res.Duplicates, res.DuplicatesByFault)
	}
}

// The backlog at a heal is what was acknowledged by then: an event whose schedule was
// only ever answered info may have been stored after the heal (seed 20261217: a call
// forwarded to a partitioned node reached it as the partition healed, 20 s on, and its
// event, due during the partition, fired 2.08 s after the heal).
func TestRecoveryCountsAcknowledgedEvents(t *testing.T) {
	kill := Op{F: FNemesis, Kind: "partition-one", InvokeNs: at(25 * time.Second), CompleteNs: at(30 * time.Second)}
	ackedOp, ackedRec := event("acked", 27*time.Second, 3400*time.Millisecond)    // 30.4 s
	unsureOp, unsureRec := event("unsure", 26*time.Second, 6100*time.Millisecond) // 32.1 s
	unsureOp.Type, unsureOp.Code, unsureOp.AckDueNs = TypeInfo, "DeadlineExceeded", 0
	lateAckOp, lateAckRec := event("late-ack", 26*time.Second, 5800*time.Millisecond) // 31.8 s
	lateAckOp.CompleteNs = at(30*time.Second) + 1                                     // acknowledged only after the heal
	res := Check([]Op{kill, ackedOp, unsureOp, lateAckOp}, []Record{ackedRec, unsureRec, lateAckRec}, cleanCluster(1), Config{})
	if len(res.Recovery) != 1 || res.Recovery[0].RecoveryMs != 400 {
		t.Errorf("recovery = %+v, want 400 ms (the acknowledged event; the unanswered one and the one acknowledged after the heal are no backlog)", res.Recovery)
	}
}

// An event accepted after its due time (a deliver_at in the past, or a retry
// of a request refused during a fault) is late only from its acceptance.
func TestLatenessCountsFromAcceptance(t *testing.T) {
	op, rec := event("past", 10*time.Second, 30*time.Second+4*time.Millisecond)
	op.InvokeNs, op.CompleteNs = at(40*time.Second), at(40*time.Second)+1e6 // accepted 30 s after due
	refused := op
	refused.Type, refused.Code, refused.InvokeNs, refused.CompleteNs = TypeFail, "InvalidArgument", at(5*time.Second), at(5*time.Second)
	res := Check([]Op{refused, op}, []Record{rec}, cleanCluster(1), Config{})
	assertClean(t, res)
	if got := res.LatenessMs.Healthy; got.Count != 1 || got.Max != 4 {
		t.Errorf("lateness of an event accepted after its due = %+v, want 4 ms from acceptance", got)
	}
}

// An event with a window may fire anywhere in [due, due+window]: its lateness counts from
// the window's end (0 inside it), the backlog at a heal leaves out what its window lets
// fire later, and a record before the due is early all the same.
func TestLatenessCountsTheWindow(t *testing.T) {
	windowed := func(id string, due, late time.Duration) (Op, Record) {
		op, rec := event(id, due, late)
		op.WindowNs = int64(2 * time.Second)
		return op, rec
	}
	var ops []Op
	var recs []Record
	add := func(op Op, rec Record) { ops = append(ops, op); recs = append(recs, rec) }
	add(windowed("in", 10*time.Second, 1500*time.Millisecond))   // inside: 0
	add(windowed("edge", 11*time.Second, 2000*time.Millisecond)) // at the window's end: 0
	add(windowed("past", 12*time.Second, 2300*time.Millisecond)) // 300 ms past it
	add(event("plain", 13*time.Second, 40*time.Millisecond))     // no window: 40
	res := Check(ops, recs, cleanCluster(1), Config{})
	assertClean(t, res)
	if got, want := res.LatenessMs.Healthy, (Quantiles{Count: 4, P50: 0, P99: 300, Max: 300}); got != want {
		t.Errorf("lateness = %+v, want %+v", got, want)
	}

	// A kill healed at 30 s: "late", due at 29 s with a 2 s window, may fire until 31 s and
	// is no backlog; "due", due at 27 s with a 2 s window, had to fire by the heal.
	kill := Op{F: FNemesis, Kind: "kill", InvokeNs: at(25 * time.Second), CompleteNs: at(30 * time.Second)}
	lateOp, lateRec := windowed("late", 29*time.Second, 1900*time.Millisecond) // 30.9 s
	dueOp, dueRec := windowed("due", 27*time.Second, 3400*time.Millisecond)    // 30.4 s
	res = Check([]Op{kill, lateOp, dueOp}, []Record{lateRec, dueRec}, cleanCluster(1), Config{})
	assertClean(t, res)
	if len(res.Recovery) != 1 || res.Recovery[0].RecoveryMs != 400 {
		t.Errorf("recovery = %+v, want 400 ms (the window of the event due at 29 s reaches past the heal)", res.Recovery)
	}

	// Never early, window or not.
	op, rec := windowed("early", 10*time.Second, -3*time.Millisecond)
	assertOnly(t, Check([]Op{op}, []Record{rec}, cleanCluster(1), Config{}), "early", "early")
}

// addGet appends a get of id, invoked at t and answered 2 ms later, that found nothing
// (state "") or the event in state.
func (g *run) addGet(id string, t int64, state string) {
	op := Op{Index: len(g.ops), Process: 3, F: FGet, Node: "n2", ID: id, InvokeNs: t, CompleteNs: t + 2e6, Type: TypeOK, State: state}
	if state == "" {
		op.Type, op.Code, op.Error = TypeFail, CodeNotFound, "id: no event"
	}
	g.ops = append(g.ops, op)
}

// TestRetentionRules: a get that finds nothing is fine once the retention has passed since
// the event settled, and a violation before (with the retention off, always); a get that
// finds the event again after one found nothing is a resurrection.
func TestRetentionRules(t *testing.T) {
	fired := func(g *run) (string, int64) {
		id := g.pick("acked", g.awayFromFaults)
		return id, g.recs[g.recsOf(id)[0]].AppendMs * 1e6
	}
	t.Run("removed after the retention", func(t *testing.T) {
		g := genClean(7, 650)
		g.cfg.Retention = time.Minute
		id, settled := fired(g)
		g.addGet(id, settled+int64(time.Second), "fired")
		g.addGet(id, settled+int64(61*time.Second), "")
		g.addGet(id, settled+int64(62*time.Second), "")
		assertClean(t, g.check())
	})
	t.Run("removed before the retention", func(t *testing.T) {
		g := genClean(7, 650)
		g.cfg.Retention = time.Minute
		id, settled := fired(g)
		g.addGet(id, settled+int64(50*time.Second), "")
		assertOnly(t, g.check(), "expired_early", id)
	})
	t.Run("removed with the retention off", func(t *testing.T) {
		g := genClean(7, 650)
		id, settled := fired(g)
		g.addGet(id, settled+int64(time.Hour), "")
		assertOnly(t, g.check(), "expired_early", id)
	})
	t.Run("pending and not found", func(t *testing.T) {
		g := genClean(7, 650)
		g.cfg.Retention = time.Minute
		id := g.pick("cancel_before", g.awayFromFaults)
		g.ops = slices.DeleteFunc(g.ops, func(op Op) bool { return op.ID == id && op.F == FCancel })
		sched := g.ops[g.opsOf(id, FSchedule)[0]]
		g.addGet(id, sched.CompleteNs+int64(time.Second), "")
		res := g.check()
		if res.ExpiredEarly != 1 || res.Lost != 1 {
			t.Fatalf("a pending event not found: expired_early %d lost %d, want 1 and 1", res.ExpiredEarly, res.Lost)
		}
	})
	t.Run("found again", func(t *testing.T) {
		g := genClean(7, 650)
		g.cfg.Retention = time.Minute
		id, settled := fired(g)
		g.addGet(id, settled+int64(61*time.Second), "")
		g.addGet(id, settled+int64(65*time.Second), "fired")
		assertOnly(t, g.check(), "resurrected", id)
	})
}

// lastUpdate returns the index in g.ops of the last ok update of id, and the index in
// g.recs of its record.
func (g *run) lastUpdate(id string) (op, rec int) {
	ups := g.opsOf(id, FUpdate)
	recs := g.recsOf(id)
	return ups[len(ups)-1], recs[len(recs)-1]
}

func TestPlantUpdateStaleRecord(t *testing.T) {
	g := genClean(3, 650)
	id := g.pick("updated", func(id string) bool { return g.awayFromFaults(id) && len(g.opsOf(id, FUpdate)) == 1 })
	u, rec := g.lastUpdate(id)
	first := g.ops[g.opsOf(id, FSchedule)[0]]
	stale := g.recs[rec]
	stale.Version, stale.Payload, stale.Offset = 1, first.Payload, 9999
	stale.AppendMs = max(first.AckDueNs, g.ops[u].CompleteNs)/1e6 + 10
	g.recs = append(g.recs, stale)
	res := g.check()
	assertOnly(t, res, "update_violations", id)
	if !strings.Contains(res.Examples["update_violations"][0].Why, "after the update to version") {
		t.Errorf("why: %s", res.Examples["update_violations"][0].Why)
	}
}

func TestPlantUpdateLost(t *testing.T) {
	g := genClean(3, 650)
	id := g.pick("updated", nil)
	g.dropRecords(id)
	res := g.check()
	assertOnly(t, res, "update_violations", id)
	if !strings.Contains(res.Examples["update_violations"][0].Why, "no record of it or a later version") {
		t.Errorf("why: %s", res.Examples["update_violations"][0].Why)
	}
}

func TestPlantUpdateWrongContent(t *testing.T) {
	g := genClean(3, 650)
	id := g.pick("updated", func(id string) bool { return len(g.opsOf(id, FUpdate)) == 2 })
	ups := g.opsOf(id, FUpdate)
	_, rec := g.lastUpdate(id)
	g.recs[rec].Payload = g.ops[ups[0]].Payload // version 3 with version 2's payload
	res := g.check()
	assertOnly(t, res, "update_violations", id)
	if !strings.Contains(res.Examples["update_violations"][0].Why, "the update that made it set") {
		t.Errorf("why: %s", res.Examples["update_violations"][0].Why)
	}
}

func TestPlantStaleRead(t *testing.T) {
	g := genClean(3, 650)
	id := g.pick("updated", nil)
	u, _ := g.lastUpdate(id)
	gi := g.ops[u].CompleteNs + int64(time.Millisecond)
	g.ops = append(g.ops, Op{Index: len(g.ops), F: FGet, ID: id, Node: "n1", Type: TypeOK, State: StateScheduled, Version: 1,
		InvokeNs: gi, CompleteNs: gi + int64(time.Millisecond)})
	assertOnly(t, g.check(), "stale_reads", id)
}

// TestDuplicatesCountCopiesOfOneVersion: a record of a new version is no
// duplicate; a second copy of a version is.
func TestDuplicatesCountCopiesOfOneVersion(t *testing.T) {
	g := genClean(5, 650)
	id := g.pick("update_info", func(id string) bool {
		recs := g.recsOf(id)
		return len(recs) == 1 && g.recs[recs[0]].Version == 0 && g.awayFromFaults(id)
	})
	u := g.ops[g.opsOf(id, FUpdate)[0]]
	v2 := g.recs[g.recsOf(id)[0]]
	v2.Version, v2.Payload, v2.Offset, v2.AppendMs = 2, u.Payload, 9998, v2.AppendMs+5000
	g.recs = append(g.recs, v2)
	res := g.check()
	assertClean(t, res)
	if res.Duplicates != 0 {
		t.Fatalf("a second version counted as a duplicate: %v", res.Examples["duplicates"])
	}
	v2.Offset, v2.AppendMs = 9999, v2.AppendMs+1
	g.recs = append(g.recs, v2)
	if res = g.check(); res.Duplicates != 1 {
		t.Fatalf("a copy of version 2: duplicates = %d, want 1", res.Duplicates)
	}
}

// addList appends an ok list op of prefix, invoked at t and answered 2 ms later, that read
// one page and showed entries.
func (g *run) addList(prefix string, t int64, states []string, entries ...Listed) {
	g.ops = append(g.ops, Op{Index: len(g.ops), Process: 4, F: FList, Node: "n3", Prefix: prefix, States: states,
		Type: TypeOK, Pages: 1, Listed: entries, InvokeNs: t, CompleteNs: t + 2e6})
}

func TestPlantListStaleVersion(t *testing.T) {
	g := genClean(3, 650)
	id := g.pick("updated", nil)
	u, _ := g.lastUpdate(id)
	up := g.ops[u]
	g.addList(id, up.CompleteNs+int64(time.Millisecond), nil,
		Listed{ID: id, State: StateScheduled, Version: up.Version - 1, DueNs: up.AckDueNs})
	res := g.check()
	assertOnly(t, res, "stale_reads", id)
	if why := res.Examples["stale_reads"][0].Why; !strings.Contains(why, "list op") || !strings.Contains(why, "showed version") {
		t.Errorf("why: %s", why)
	}
}

func TestPlantListShowsCancelledAsScheduled(t *testing.T) {
	t.Run("cancel", func(t *testing.T) {
		g := genClean(7, 650)
		id := g.pick("cancel_before", nil)
		c := g.ops[g.opsOf(id, FCancel)[0]]
		g.addList(id, c.CompleteNs+int64(time.Millisecond), nil, Listed{ID: id, State: StateScheduled, Version: 1, DueNs: g.due[id]})
		res := g.check()
		assertOnly(t, res, "stale_reads", id)
		if why := res.Examples["stale_reads"][0].Why; !strings.Contains(why, "showed it scheduled; the cancel was acked") {
			t.Errorf("why: %s", why)
		}
	})
	t.Run("bulk cancel", func(t *testing.T) {
		g := genClean(7, 650)
		b, id := g.certainBulk()
		show := func() {
			g.addList(g.ops[b].Prefix, g.ops[b].CompleteNs+int64(time.Millisecond), nil,
				Listed{ID: id, State: StateScheduled, Version: 1, DueNs: g.due[id]})
		}
		show()
		res := g.check()
		assertOnly(t, res, "stale_reads", id)
		if why := res.Examples["stale_reads"][0].Why; !strings.Contains(why, fmt.Sprintf("cancel_matching op %d", b)) {
			t.Errorf("why: %s", why)
		}
		// Had it held one back, it would not have promised this one was cancelled.
		g = genClean(7, 650)
		b, id = g.certainBulk()
		g.ops[b].Cancelled--
		g.ops[b].SkippedHeld++
		show()
		assertClean(t, g.check())
	})
}

func TestPlantListMissesPendingEvent(t *testing.T) {
	pending := func(g *run) (string, Op) {
		id := g.pick("acked", func(id string) bool {
			s := g.ops[g.opsOf(id, FSchedule)[0]]
			return g.awayFromFaults(id) && g.due[id]-s.CompleteNs > int64(100*time.Millisecond)
		})
		return id, g.ops[g.opsOf(id, FSchedule)[0]]
	}
	t.Run("pending", func(t *testing.T) {
		g := genClean(7, 650)
		id, s := pending(g)
		g.addList(id, s.CompleteNs+int64(time.Millisecond), nil)
		res := g.check()
		assertOnly(t, res, "stale_reads", id)
		if why := res.Examples["stale_reads"][0].Why; !strings.Contains(why, "did not list it") || !strings.Contains(why, "has not settled") {
			t.Errorf("why: %s", why)
		}
	})
	t.Run("invoked before the ack", func(t *testing.T) {
		g := genClean(7, 650)
		id, s := pending(g)
		g.addList(id, s.CompleteNs-1, nil)
		assertClean(t, g.check())
	})
	t.Run("fired, within and past the retention", func(t *testing.T) {
		g := genClean(7, 650)
		g.cfg.Retention = 30 * time.Second
		id, _ := pending(g)
		fired := g.recs[g.recsOf(id)[0]].AppendMs * 1e6
		g.addList(id, fired+int64(31*time.Second), nil) // may have expired
		assertClean(t, g.check())
		g.addList(id, fired+int64(10*time.Second), nil)
		res := g.check()
		assertOnly(t, res, "stale_reads", id)
		if why := res.Examples["stale_reads"][0].Why; !strings.Contains(why, "less than the retention") {
			t.Errorf("why: %s", why)
		}
	})
	t.Run("filtered or unfinished lists say nothing of what they left out", func(t *testing.T) {
		g := genClean(7, 650)
		id, s := pending(g)
		g.addList(id, s.CompleteNs+int64(time.Millisecond), []string{StateFired})
		g.addList(id, s.CompleteNs+int64(time.Millisecond), nil)
		g.ops[len(g.ops)-1].More = true
		assertClean(t, g.check())
	})
}

func TestPlantListWrongState(t *testing.T) {
	g := genClean(7, 650)
	id := g.pick("acked", g.awayFromFaults)
	fired := g.recs[g.recsOf(id)[0]].AppendMs * 1e6
	g.addList(id, fired+int64(time.Second), []string{StateScheduled}, Listed{ID: id, State: StateFired, Version: 1, DueNs: g.due[id]})
	res := g.check()
	assertOnly(t, res, "stale_reads", id)
	if why := res.Examples["stale_reads"][0].Why; !strings.Contains(why, "filtered by states [scheduled], listed it fired") {
		t.Errorf("why: %s", why)
	}
}

// TestListMissingInfoCancelledIsNotStale: a list may leave out an event a cancel of unknown
// outcome was sent for, not one whose cancel failed.
func TestListMissingInfoCancelledIsNotStale(t *testing.T) {
	g := genClean(7, 650)
	id := g.pick("cancel_info", func(id string) bool { return len(g.recsOf(id)) > 0 && len(g.opsOf(id, FList)) == 0 })
	ci := g.opsOf(id, FCancel)[0]
	g.addList(id, g.ops[ci].CompleteNs+int64(time.Millisecond), nil)
	assertClean(t, g.check())
	g.ops[ci].Type, g.ops[ci].Code = TypeFail, "FailedPrecondition"
	res := g.check()
	if res.StaleReads != 1 || len(res.Examples["stale_reads"]) != 1 || res.Examples["stale_reads"][0].ID != id {
		t.Fatalf("with the cancel failed: stale_reads %d %v, want the list that left it out", res.StaleReads, res.Examples["stale_reads"])
	}
}

// certainBulk returns the index in g.ops of an ok bulk cancel that cancelled every event of
// its group (no dry run, nothing skipped), and an id of the group, which has no record.
func (g *run) certainBulk() (int, string) {
	for i, op := range g.ops {
		if op.F != FCancelMatching || op.Type != TypeOK || op.DryRun || op.SkippedHeld != 0 || op.SkippedFired != 0 {
			continue
		}
		id := op.Prefix + "1"
		if len(g.recsOf(id)) == 0 && op.Matched == op.Cancelled && len(g.recsOf(op.Prefix+"0")) == 0 {
			return i, id
		}
	}
	panic("no ok bulk cancel that cancelled all its group")
}

// bulkRecord appends a record of id (of a bulk group) appended 5 ms after its due time, or
// after the end of bulk cancel b if that is later.
func (g *run) bulkRecord(id string, b Op) {
	s := g.ops[g.opsOf(id, FSchedule)[0]]
	t := max(g.due[id], b.CompleteNs) + int64(5*time.Millisecond)
	g.recs = append(g.recs, Record{ID: id, Topic: s.Topic, Payload: s.Payload, Offset: 99999, DueMs: g.due[id] / 1e6,
		FiredMs: t/1e6 - 1, Attempt: 1, AppendMs: t / 1e6})
}

func TestPlantBulkCancelledRecord(t *testing.T) {
	g := genClean(7, 650)
	b, id := g.certainBulk()
	g.bulkRecord(id, g.ops[b])
	res := g.check()
	assertOnly(t, res, "bulk_cancel_violations", id)
	if why := res.Examples["bulk_cancel_violations"][0].Why; !strings.Contains(why, fmt.Sprintf("after cancel_matching op %d", b)) {
		t.Errorf("why: %s", why)
	}
}

// TestBulkHeldThenRecordIsNoViolation: a bulk cancel that held some events back promised
// nothing about any one event of its filter.
func TestBulkHeldThenRecordIsNoViolation(t *testing.T) {
	g := genClean(7, 650)
	b, id := g.certainBulk()
	g.ops[b].Cancelled--
	g.ops[b].SkippedHeld++
	g.bulkRecord(id, g.ops[b])
	assertClean(t, g.check())
}

// TestBulkMayHaveCancelledIsNotLost: an event a bulk cancel may have cancelled need not
// fire; one only a dry run or a refused bulk cancel matched must.
func TestBulkMayHaveCancelledIsNotLost(t *testing.T) {
	g := genClean(7, 650)
	b, _ := g.certainBulk()
	g.ops[b].Type, g.ops[b].Code = TypeInfo, "Unavailable"
	assertClean(t, g.check())
	group := 0
	for _, id := range g.ids["bulk"] {
		if strings.HasPrefix(id, g.ops[b].Prefix) {
			group++
		}
	}
	for name, change := range map[string]func(op *Op){
		"dry run": func(op *Op) { op.Type, op.Code, op.DryRun, op.Cancelled = TypeOK, "", true, 0 },
		"refused": func(op *Op) { op.Type, op.Code, op.DryRun = TypeFail, "InvalidArgument", false },
	} {
		change(&g.ops[b])
		if res := g.check(); res.Lost != group {
			t.Errorf("%s: lost = %d, want its group's %d events", name, res.Lost, group)
		}
	}
}

func TestPlantBulkCountsDisagree(t *testing.T) {
	cases := []struct {
		name, want string
		find       func(op Op) bool
		plant      func(op *Op)
	}{
		{"matched more than it counted", "cancelled+skipped_fired+skipped_held", func(op Op) bool {
			return op.F == FCancelMatching && op.Type == TypeOK && !op.DryRun
		}, func(op *Op) { op.Matched++ }},
		{"part-way, counted twice", "cancelled+skipped_fired+skipped_held", func(op Op) bool {
			return op.F == FCancelMatching && op.Type == TypeInfo && op.Matched > 0
		}, func(op *Op) { op.SkippedHeld++ }},
		{"a dry run that cancelled", "was a dry run", func(op Op) bool {
			return op.F == FCancelMatching && op.Type == TypeOK && op.DryRun
		}, func(op *Op) { op.Cancelled = 1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := genClean(7, 650)
			i := slices.IndexFunc(g.ops, tc.find)
			if i < 0 {
				t.Fatal("no such bulk cancel")
			}
			tc.plant(&g.ops[i])
			res := g.check()
			assertOnly(t, res, "bulk_cancel_violations", g.ops[i].Prefix)
			if why := res.Examples["bulk_cancel_violations"][0].Why; !strings.Contains(why, tc.want) {
				t.Errorf("why: %s", why)
			}
		})
	}
}

// TestBulkPromisesOnlyWhatItMatched: an ok bulk cancel that skipped nothing promises nothing
// about an event that had a record by its end (it fired first, unmatched: a stray later copy
// is a duplicate, as after a Cancel that failed because the event had fired), or that an
// update may have moved while it ran.
func TestBulkPromisesOnlyWhatItMatched(t *testing.T) {
	t.Run("fired before it", func(t *testing.T) {
		g := genClean(7, 650)
		i := slices.IndexFunc(g.ops, func(op Op) bool { // variation "fired before": its first event is unmatched
			return op.F == FCancelMatching && op.Type == TypeOK && !op.DryRun && op.SkippedFired == 0 &&
				op.SkippedHeld == 0 && len(g.recsOf(op.Prefix+"0")) > 0
		})
		if i < 0 {
			t.Fatal("no ok bulk cancel whose first event fired before it")
		}
		id := g.ops[i].Prefix + "0"
		dup := g.recs[g.recsOf(id)[0]]
		dup.Offset, dup.AppendMs = 99999, g.ops[i].CompleteNs/1e6+50
		g.recs = append(g.recs, dup)
		res := g.check()
		assertClean(t, res)
		if res.Duplicates != 1 {
			t.Errorf("duplicates = %d, want the stray copy", res.Duplicates)
		}
	})
	t.Run("updated while it ran", func(t *testing.T) {
		g := genClean(7, 650)
		b, id := g.certainBulk()
		bulk := g.ops[b]
		s := g.ops[g.opsOf(id, FSchedule)[0]]
		u := Op{Index: len(g.ops), F: FUpdate, ID: id, Node: "n1", Payload: s.Payload + "-u", Type: TypeOK, Version: 2,
			DelayNs: int64(2 * time.Second), InvokeNs: bulk.InvokeNs + 1e6, CompleteNs: bulk.InvokeNs + 3e6}
		u.AckDueNs = u.CompleteNs + u.DelayNs
		g.ops = append(g.ops, u)
		// The group's lists showed version 1, or it cancelled: not what this history says.
		g.ops = slices.DeleteFunc(g.ops, func(op Op) bool { return op.F == FList && op.Prefix == bulk.Prefix })
		g.due[id] = u.AckDueNs
		g.bulkRecord(id, bulk)
		g.recs[len(g.recs)-1].Version, g.recs[len(g.recs)-1].Payload = 2, u.Payload
		assertClean(t, g.check())
	})
}

// TestPlantMembershipNotConverged: with the replication factor given, a shard whose
// configuration is not that many voters on live members (a removed node kept, a voter short,
// a non-voter left mid-change, a voter that is not running) has not converged, though its
// replicas agree.
func TestPlantMembershipNotConverged(t *testing.T) {
	clean := func() *run {
		g := genClean(3, 200)
		g.final.Replication = 3
		g.final.Live = []string{"n1", "n2", "n3", "n4", "n5", "n6"}
		g.final.Removed = []string{"n7"}
		for i := range g.final.Shards {
			s := &g.final.Shards[i]
			for _, r := range s.Replicas {
				s.Voters = append(s.Voters, r.Node)
			}
		}
		return g
	}
	if res := clean().check(); !res.Converged || !res.Valid {
		t.Fatalf("the clean run: converged %v, valid %v: %v", res.Converged, res.Valid, res.ConvergenceProblems)
	}
	cases := []struct {
		name, want string
		plant      func(s *ShardState)
	}{
		{"a removed node still a voter", "voter n7 is a removed node", func(s *ShardState) { s.Voters[1] = "n7" }},
		{"a voter short", "2 voters", func(s *ShardState) { s.Voters = s.Voters[:2] }},
		{"a non-voter left", "non-voters left in the configuration (n6)", func(s *ShardState) { s.Nonvoters = []string{"n6"} }},
		{"a voter not running", "voter n8 is not a live member", func(s *ShardState) { s.Voters[2] = "n8" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := clean()
			tc.plant(&g.final.Shards[2])
			res := g.check()
			if res.Valid || res.Converged {
				t.Errorf("valid %v converged %v, want both false", res.Valid, res.Converged)
			}
			p := res.ConvergenceProblems
			if len(p) != 1 || !strings.HasPrefix(p[0], "shard 2: ") || !strings.Contains(p[0], tc.want) {
				t.Fatalf("problems %q, want one about shard 2 saying %q", p, tc.want)
			}
		})
	}
}

// TestFiringOrphansMeasured: the log lines of events a leader's sweep put back are counted
// and shown, and the run stays valid (the events still fired, never early).
func TestFiringOrphansMeasured(t *testing.T) {
	g := genClean(3, 200)
	g.final.Orphans = []Orphan{{Node: "n2", Line: `level=ERROR msg="an overdue pending event was in no part of the firing" seq=42`}}
	res := g.check()
	if !res.Valid || res.FiringOrphans != 1 || len(res.Examples["firing_orphans"]) != 1 || res.Examples["firing_orphans"][0].ID != "n2" {
		t.Fatalf("valid %v firing_orphans %d examples %v; want true 1 and the line", res.Valid, res.FiringOrphans, res.Examples["firing_orphans"])
	}
	if clean := genClean(3, 200).check(); clean.FiringOrphans != 0 {
		t.Fatalf("a run without orphan lines: firing_orphans %d", clean.FiringOrphans)
	}
}
