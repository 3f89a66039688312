package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// helmModule is the helm the checks build when none is on the PATH. helm
// stays out of this module's go.mod: its dependencies would move the
// product's wherever the two are built together, in the go.work workspace
// (bbolt under the Raft log store among them), so it is built as a tool of
// its own.
const helmModule = "helm.sh/helm/v3/cmd/helm@v3.22.0"

// helmBin is the helm every check runs, found or built once per test binary.
var helmBin struct {
	once sync.Once
	path string
	err  error
}

// helmPath returns the helm on the PATH or, when there is none, one built
// from helmModule into a directory that TestMain removes.
func helmPath(t *testing.T) string {
	t.Helper()
	helmBin.once.Do(func() {
		if path, err := exec.LookPath("helm"); err == nil {
			helmBin.path = path
			return
		}
		dir, err := os.MkdirTemp("", "chime-helm")
		if err != nil {
			helmBin.err = err
			return
		}
		binaries.cleanup = append(binaries.cleanup, dir)
		helmBin.path, helmBin.err = buildHelm(dir)
	})
	if helmBin.err != nil {
		t.Fatal(helmBin.err)
	}
	return helmBin.path
}

// buildHelm installs helmModule into dir and returns the binary's path. On a
// machine that has never fetched helm this downloads its modules and compiles
// them (minutes on two cores); afterwards Go's build cache makes it a link.
// CGO_ENABLED is fixed so that a PATH without a C compiler (which turns cgo
// off by default) reuses the same cached build instead of compiling anew.
func buildHelm(dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no helm on the PATH, and no go to build %s with: %v", helmModule, err)
	}
	cmd := exec.Command(goTool, "install", helmModule)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("no helm on the PATH, and GOBIN=%s CGO_ENABLED=0 go install %s failed: %v\n%s", dir, helmModule, err, out)
	}
	return filepath.Join(dir, "helm"), nil
}

// helmError is a helm run that failed: the command line, how it ended and
// what helm wrote on stderr, where it explains itself.
type helmError struct {
	cmd    string
	err    error
	stderr string
}

func (e *helmError) Error() string {
	return fmt.Sprintf("%s: %v\nstderr:\n%s", e.cmd, e.err, e.stderr)
}

func (e *helmError) Unwrap() error { return e.err }

// helm runs helm with args and returns its stdout alone: the rendered
// manifests for template, which must not be mixed with anything helm or a
// build step writes on stderr. A failure is a *helmError carrying stderr.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runHelm(helmPath(t), args...)
}

func runHelm(path string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &helmError{cmd: strings.Join(cmd.Args, " "), err: err, stderr: stderr.String()}
	}
	return stdout.String(), nil
}

// TestHelmFallback runs the checks' helm helper as a newcomer's machine
// would, with no helm on the PATH: it must build helm itself and render
// manifests that decode, and a failed run must say what ran and what helm
// wrote on stderr. CI machines may have a helm installed; this test is what
// keeps the fallback exercised there.
func TestHelmFallback(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	onlyGo := t.TempDir()
	if err := os.Symlink(goTool, filepath.Join(onlyGo, "go")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", onlyGo)
	if _, err := exec.LookPath("helm"); err == nil {
		t.Fatal("helm is still on the PATH")
	}

	path, err := buildHelm(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := runHelm(path, "template", "chime", chartDir, "--namespace", namespace, "--kube-version", kubeVersion, "-f", valuesFile("insecure"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeManifests(out)
	if err != nil {
		t.Fatalf("the fallback's output does not decode: %v\n%s", err, out)
	}
	if len(m.statefulSets) != 1 {
		t.Errorf("the fallback rendered %d StatefulSets, want 1", len(m.statefulSets))
	}

	_, err = runHelm(path, "template", "chime", chartDir, "--kube-version", kubeVersion, "--set", "kafka.brokers=k:9092")
	var he *helmError
	if !errors.As(err, &he) {
		t.Fatalf("a chart that refuses to render: err = %v, want a *helmError", err)
	}
	for _, want := range []string{path + " template chime", "refusing to render"} {
		if !strings.Contains(he.Error(), want) {
			t.Errorf("the failure does not say %q:\n%v", want, he)
		}
	}
}
