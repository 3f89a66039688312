// Package deploy holds only tests: the checks that the files under deploy/
// (the container image, the compose cluster, the Helm chart, the systemd unit,
// the Prometheus alerts and the Grafana dashboard) agree with what chimed and
// chimectl really accept and export. There is no container runtime where they
// run, so each file is checked by the loader or decoder of the tool that reads
// it (Helm, the Kubernetes API types, compose-spec's loader, systemd-analyze)
// and against the binaries built from this repository.
package deploy

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// binaries are chimed and chimectl built once per test binary, the way the
// Dockerfile builds them (static, -trimpath), so the checks see the flags,
// subcommands and metrics of what the image ships.
var binaries struct {
	once             sync.Once
	chimed, chimectl string
	err              error
	// cleanup lists the directories TestMain removes: the binaries' and a
	// built helm's.
	cleanup []string
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range binaries.cleanup {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintf(os.Stderr, "removing %s: %v\n", dir, err)
		}
	}
	os.Exit(code)
}

// builtBinaries returns the paths of chimed and chimectl, building them on
// first use.
func builtBinaries(t *testing.T) (chimed, chimectl string) {
	t.Helper()
	root := repoRoot(t)
	binaries.once.Do(func() {
		dir, err := os.MkdirTemp("", "chime-deploy")
		if err != nil {
			binaries.err = err
			return
		}
		binaries.cleanup = append(binaries.cleanup, dir)
		// The Dockerfile's build command, run where it runs: at the
		// repository root, on the product module alone (the image's build
		// context has no go.work, so GOWORK=off), not in this module.
		cmd := exec.Command("go", "build", "-trimpath", "-o", dir+string(filepath.Separator), "./cmd/chimed", "./cmd/chimectl")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			binaries.err = fmt.Errorf("CGO_ENABLED=0 GOWORK=off go build ./cmd/chimed ./cmd/chimectl in %s: %v\n%s", cmd.Dir, err, out)
			return
		}
		binaries.chimed, binaries.chimectl = filepath.Join(dir, "chimed"), filepath.Join(dir, "chimectl")
	})
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	return binaries.chimed, binaries.chimectl
}

// TestStaticBuild checks that the Dockerfile's build makes static binaries:
// the distroless static image has no libc and no dynamic loader, so a
// binary that asks for one (an ELF interpreter) would not start there.
func TestStaticBuild(t *testing.T) {
	chimed, chimectl := builtBinaries(t)
	for _, bin := range []string{chimed, chimectl} {
		if interp, err := elfInterpreter(bin); err != nil {
			t.Fatal(err)
		} else if interp != "" {
			t.Errorf("%s is linked dynamically (interpreter %s); the distroless static image cannot run it", filepath.Base(bin), interp)
		}
	}
}

// elfInterpreter returns the dynamic loader an ELF binary names, "" for a
// static one.
func elfInterpreter(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", err
			}
			return string(bytes.TrimRight(b, "\x00")), nil
		}
	}
	return "", nil
}

func TestElfInterpreterFindsDynamicBinaries(t *testing.T) {
	// The test binary itself is built with cgo (-race needs it) or without;
	// /bin/sh is always dynamic on the Debian machines this runs on.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to compare with")
	}
	sh, _ = filepath.EvalSymlinks(sh)
	interp, err := elfInterpreter(sh)
	if err != nil {
		t.Skipf("%s is not an ELF binary: %v", sh, err)
	}
	if interp == "" {
		t.Errorf("%s: no interpreter found; the static-build check could not tell a dynamic binary", sh)
	}
}

// repoRoot is the directory holding the product's go.mod (module
// github.com/chimehq/chime), above the test's working directory (deploy/,
// whose go.mod is this module's own).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/chimehq/chime\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of github.com/chimehq/chime above the working directory")
		}
		dir = parent
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
