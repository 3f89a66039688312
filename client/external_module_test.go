package client_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// examplesDir holds modules of their own that use this one as a service
// outside the repository would (a replace directive points them here).
// `go test ./...` in this module does not descend into them, so this test
// runs their tests: the README's single test command covers them.
const examplesDir = "../examples"

// TestExampleModules runs `go test ./...` in each module under
// ../examples with the go command that runs this test, as its user would
// (the environment inherited: GOPROXY, GOCACHE, GOMODCACHE...), and with
// -race when this test was built with it.
func TestExampleModules(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and tests the example modules")
	}
	// go test puts the GOROOT/bin of the go command that runs it first on
	// the tests' PATH (Go 1.19 and later): this is that go command.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	mods, err := filepath.Glob(filepath.Join(examplesDir, "*", "go.mod"))
	if err != nil || len(mods) == 0 {
		t.Fatalf("no example module under %s (%v)", examplesDir, err)
	}
	goflags, err := exec.Command(goBin, "env", "GOFLAGS").Output()
	if err != nil {
		t.Fatalf("go env GOFLAGS: %v", err)
	}
	for _, mod := range mods {
		dir := filepath.Dir(mod)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			readModule(t, dir)
			ctx := context.Background()
			if dl, ok := t.Deadline(); ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, dl.Add(-10*time.Second))
				defer cancel()
			}
			args := []string{"test", "-count=1", "-timeout", "10m"}
			if raceEnabled() {
				args = append(args, "-race")
			}
			cmd := exec.CommandContext(ctx, goBin, append(args, "./...")...)
			cmd.Dir = dir
			// -mod=mod: a dependency chime gained since the example's
			// go.sum was written is looked up rather than refused. It is
			// added to the GOFLAGS in effect (the environment's, or go
			// env -w's, which an environment variable would hide).
			cmd.Env = append(os.Environ(), "GOFLAGS="+strings.Join(append(strings.Fields(string(goflags)), "-mod=mod"), " "), "GOWORK=off")
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go %s in %s: %v\n%s", strings.Join(cmd.Args[1:], " "), dir, err, out)
			}
			t.Logf("go %s in %s: %v\n%s", strings.Join(cmd.Args[1:], " "), dir, time.Since(start).Round(time.Millisecond), out)
		})
	}
}

// readModule reads every file of the module in dir, so that go test's
// cache knows this test depends on them: a cached pass is not reused once
// one of them changed.
func readModule(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		_, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
