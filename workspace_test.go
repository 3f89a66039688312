package chime

import (
	"context"
	"encoding/json"
	"flag"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// TestWorkspaceModules runs the tests of the other modules go.work joins to
// this one (deploy/), which `go test ./...` from the repository root does not
// reach: go.work lets the root's go commands name their packages
// (`go test ./deploy/...`), but a ./... pattern still stops at a directory
// holding a go.mod. This test is what makes the README's single test command
// cover them.
//
// Modules under examples/ are left to client's TestExampleModules, which
// runs them as a service outside this repository would build them.
func TestWorkspaceModules(t *testing.T) {
	// go test puts the GOROOT/bin of the go command that runs it first on
	// the tests' PATH (Go 1.19 and later): this is that go command.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	var dirs []string
	for _, dir := range workspaceModules(t, goBin) {
		if dir == "." || strings.HasPrefix(filepath.ToSlash(dir)+"/", "examples/") {
			continue
		}
		dirs = append(dirs, dir)
	}
	if len(dirs) == 0 {
		t.Fatal("go.work lists no module besides . and examples/")
	}
	readInputs(t, dirs)
	for _, dir := range dirs {
		t.Run(filepath.ToSlash(dir), func(t *testing.T) {
			// The module's own test results are cached by the go command
			// it runs, as they were when its packages were part of this
			// module; -count is passed on only when given here.
			args := []string{"test"}
			if f := explicitFlag("test.count"); f != "" {
				args = append(args, "-count="+f)
			}
			if raceEnabled() {
				args = append(args, "-race")
			}
			if testing.Short() {
				args = append(args, "-short")
			}
			if testing.Verbose() {
				args = append(args, "-v")
			}
			// The module's tests get this test binary's -timeout less a
			// minute, so that theirs fires first and says which test hung.
			// It is derived from the flag, not from the time left, so that
			// it is the same from one run to the next, as go test's cache
			// of their results requires.
			timeout := flag.Lookup("test.timeout").Value.(flag.Getter).Get().(time.Duration)
			if timeout > 2*time.Minute {
				timeout -= time.Minute
			}
			ctx := context.Background()
			if dl, ok := t.Deadline(); ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, dl.Add(-10*time.Second))
				defer cancel()
			}
			args = append(args, "-timeout", timeout.String(), "./...")
			cmd := exec.CommandContext(ctx, goBin, args...)
			cmd.Dir = dir
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
			}
			t.Logf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, time.Since(start).Round(time.Millisecond), out)
		})
	}
}

// readInputs reads what the other modules' tests read or build from: every
// Go file, go.mod, go.sum and Markdown file of the repository, and every
// file of the modules themselves, so that go test's cache knows this test
// depends on them and does not reuse a pass once one of them changed. Build
// outputs and local data (chimed binaries, chime-data/) are left out.
func readInputs(t *testing.T, dirs []string) {
	t.Helper()
	modules := map[string]bool{}
	for _, dir := range dirs {
		modules[dir] = true
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && strings.HasPrefix(name, ".") {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		wanted := strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".md") ||
			strings.HasPrefix(name, "go.mod") || strings.HasPrefix(name, "go.sum") || strings.HasPrefix(name, "go.work")
		for dir := filepath.Dir(path); !wanted && dir != "."; dir = filepath.Dir(dir) {
			wanted = modules[dir]
		}
		if !wanted || !d.Type().IsRegular() {
			return nil
		}
		_, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// workspaceModules returns the directories of the modules go.work uses,
// relative to the repository root ("." for this one), read from the file
// itself so that GOWORK=off does not hide them.
func workspaceModules(t *testing.T, goBin string) []string {
	t.Helper()
	var work struct{ Use []struct{ DiskPath string } }
	out, err := exec.Command(goBin, "work", "edit", "-json", "go.work").Output()
	if err == nil {
		err = json.Unmarshal(out, &work)
	}
	if err != nil {
		t.Fatalf("go work edit -json go.work: %v\n%s", err, out)
	}
	var dirs []string
	for _, u := range work.Use {
		dirs = append(dirs, filepath.Clean(u.DiskPath))
	}
	return dirs
}

// explicitFlag returns the value of the test flag name when it was given on
// the command line, "" when it has its default.
func explicitFlag(name string) (value string) {
	flag.Visit(func(f *flag.Flag) {
		if f.Name == name {
			value = f.Value.String()
		}
	})
	return value
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
