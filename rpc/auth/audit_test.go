package auth

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/certs"
)

// TestRefusalsCannotFloodTheAuditLog: a caller refused in a loop gets its
// first refusal written, then one line a window with the count, and the
// rest is written at Close; another caller, or the same one from another
// host, is its own. Calls let through are written each time.
func TestRefusalsCannotFloodTheAuditLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t)
		defer f.a.Close()
		lines := func() []auditLine {
			f.a.auditMu.Lock() // the window's lines are written by timers
			text := f.audit.String()
			f.a.auditMu.Unlock()
			var out []auditLine
			for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
				if l == "" {
					continue
				}
				var al auditLine
				if err := json.Unmarshal([]byte(l), &al); err != nil {
					t.Fatalf("audit line %q: %v", l, err)
				}
				out = append(out, al)
			}
			return out
		}
		anonymous := callCtx("", certs.Identity{})
		for range 1000 {
			f.callWant(t, anonymous, chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"}, codes.Unauthenticated)
		}
		f.callWant(t, callCtx("guess", certs.Identity{}), chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"}, codes.Unauthenticated)
		if got := lines(); len(got) != 2 || got[0].Who != "anonymous" || got[0].Repeated != 0 || got[1].Who != "unknown token" {
			t.Fatalf("after 1000 refusals and one other: %+v", got)
		}
		time.Sleep(DefaultRefusalWindow) // advances the bubble's fake clock: no wall time passes
		synctest.Wait()
		got := lines()
		if len(got) != 3 || got[2].Who != "anonymous" || got[2].Repeated != 999 || got[2].Result != "Unauthenticated" {
			t.Fatalf("a window later: %+v; want one line counting the other 999", got)
		}
		// Quiet for a window: forgotten, so the next refusal is written at once.
		time.Sleep(2 * DefaultRefusalWindow) // the fake clock again
		synctest.Wait()
		f.callWant(t, anonymous, chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"}, codes.Unauthenticated)
		f.callWant(t, anonymous, chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: "x"}, codes.Unauthenticated)
		if got := lines(); len(got) != 4 || got[3].Repeated != 0 {
			t.Fatalf("after a quiet window: %+v", got)
		}
		f.callWant(t, callCtx("ops-token", certs.Identity{}), chimev1.Admin_Drain_FullMethodName, &chimev1.DrainRequest{}, codes.OK)
		f.callWant(t, callCtx("ops-token", certs.Identity{}), chimev1.Admin_Drain_FullMethodName, &chimev1.DrainRequest{}, codes.OK)
		if got := lines(); len(got) != 6 || got[5].Result != "OK" {
			t.Fatalf("admin calls let through are each written: %+v", got)
		}
		// Another method's first refusal is its own line; made-up method
		// names share one.
		f.callWant(t, anonymous, chimev1.Scheduler_Schedule_FullMethodName, &chimev1.ScheduleRequest{}, codes.Unauthenticated)
		for i := range 50 {
			f.callWant(t, anonymous, fmt.Sprintf("/made.up/M%d", i), nil, codes.Unauthenticated)
		}
		if got := lines(); len(got) != 8 || got[6].Method != chimev1.Scheduler_Schedule_FullMethodName || got[7].Method != "/made.up/M0" {
			t.Fatalf("other methods: %+v", got)
		}
		f.a.Close()
		if got := lines(); len(got) != 10 || got[8].Repeated+got[9].Repeated != 1+49 {
			t.Fatalf("Close writes what was held back: %+v", got)
		}
	})
}

// TestRotatingFile: the file is rotated before a line would take it past
// its size, never splitting a line; rotated files shift up and the oldest
// beyond what is kept are removed; the files are 0600.
func TestRotatingFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	r, err := OpenRotatingFile(path, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	line := func(i int) []byte { return []byte(fmt.Sprintf("%02d%s\n", i, strings.Repeat("x", 37))) } // 40 bytes
	for i := range 7 {
		if _, err := r.Write(line(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// 40+40 fit in 100, a third does not: files of lines {0,1} {2,3} {4,5} {6}.
	for name, want := range map[string][]int{"audit.log": {6}, "audit.log.1": {4, 5}, "audit.log.2": {2, 3}} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		var exp []byte
		for _, i := range want {
			exp = append(exp, line(i)...)
		}
		if !bytes.Equal(b, exp) {
			t.Errorf("%s = %q, want lines %v", name, b, want)
		}
		if fi, _ := os.Stat(filepath.Join(dir, name)); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v", name, fi.Mode().Perm())
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("a third rotated file is kept: %v", err)
	}
	// Reopened, it appends where it was.
	r, err = OpenRotatingFile(path, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Write(line(7)); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, append(line(6), line(7)...)) {
		t.Errorf("after reopening: %q", b)
	}
}
