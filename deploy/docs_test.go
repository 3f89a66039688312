package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docCommand is a shell command a document shows, its continuation lines
// joined and a trailing comment dropped.
type docCommand struct {
	where string
	words []string
}

// docCommands returns the commands in text whose first words are one of
// prefixes (e.g. "helm install").
func docCommands(name, text string, prefixes ...string) []docCommand {
	var out []docCommand
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		start := i
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(lines[i])
		}
		if c, _, ok := strings.Cut(line, " #"); ok {
			line = c
		}
		for _, p := range prefixes {
			if strings.HasPrefix(line, p+" ") {
				out = append(out, docCommand{fmt.Sprintf("%s:%d", name, start+1), strings.Fields(line)})
			}
		}
	}
	return out
}

// helmTemplateArgs turns a documented helm install, upgrade or template of
// the chart into the helm template arguments that render what it would
// install; deploy/ paths are made relative to the repository root.
func helmTemplateArgs(root string, words []string) ([]string, error) {
	if len(words) < 4 {
		return nil, fmt.Errorf("%q: want helm install|upgrade|template RELEASE CHART [flags]", strings.Join(words, " "))
	}
	var pos, flags []string
	for i := 2; i < len(words); i++ {
		w := words[i]
		if strings.HasPrefix(w, "deploy/") {
			w = filepath.Join(root, w)
		}
		switch {
		case w == "--install": // helm upgrade --install: template installs anyway
		case strings.HasPrefix(w, "-"):
			flags = append(flags, w)
			// A flag with its value in the next word.
			if !strings.Contains(w, "=") && i+1 < len(words) && !strings.HasPrefix(words[i+1], "-") &&
				(w == "--set" || w == "--set-string" || w == "--set-file" || w == "-f" || w == "--values" || w == "-n" || w == "--namespace" || w == "--version") {
				i++
				v := words[i]
				if strings.HasPrefix(v, "deploy/") {
					v = filepath.Join(root, v)
				}
				flags = append(flags, v)
			}
		default:
			pos = append(pos, w)
		}
	}
	if len(pos) != 2 {
		return nil, fmt.Errorf("%q: want one release and one chart, found %q", strings.Join(words, " "), pos)
	}
	return append([]string{"template", pos[0], pos[1], "--kube-version", kubeVersion}, flags...), nil
}

// TestDocumentedCommands: the commands README.md and docs/ show for what
// deploy/ holds work on it. A helm install renders (the chart refuses
// values it cannot run with), and the files docker compose and docker build
// are pointed at exist.
func TestDocumentedCommands(t *testing.T) {
	root := repoRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	helms, files := 0, 0
	for _, path := range docs {
		rel, _ := filepath.Rel(root, path)
		text := string(readFile(t, path))
		for _, c := range docCommands(rel, text, "helm install", "helm upgrade", "helm template") {
			helms++
			args, err := helmTemplateArgs(root, c.words)
			if err != nil {
				t.Errorf("%s: %v", c.where, err)
				continue
			}
			if out, err := helm(t, args...); err != nil {
				t.Errorf("%s: %s does not render: %v\n%s", c.where, strings.Join(c.words, " "), err, out)
			}
		}
		for _, c := range docCommands(rel, text, "docker compose", "docker build") {
			for i, w := range c.words {
				if w == "-f" && i+1 < len(c.words) {
					files++
					if _, err := os.Stat(filepath.Join(root, c.words[i+1])); err != nil {
						t.Errorf("%s: %s names %s, which does not exist", c.where, strings.Join(c.words, " "), c.words[i+1])
					}
				}
			}
		}
	}
	if helms == 0 || files == 0 {
		t.Errorf("found %d helm commands and %d docker -f files in README.md and docs/; the documents show both", helms, files)
	}
}

func TestDocCommandsParsing(t *testing.T) {
	text := "text\n    helm install chime deploy/kubernetes/chime \\\n      --set insecure=true   # a trial\n  docker compose -f x.yaml up\n"
	got := docCommands("doc", text, "helm install", "docker compose")
	if len(got) != 2 || got[0].where != "doc:2" || strings.Join(got[0].words, " ") != "helm install chime deploy/kubernetes/chime --set insecure=true" ||
		strings.Join(got[1].words, " ") != "docker compose -f x.yaml up" {
		t.Fatalf("docCommands = %+v", got)
	}
	args, err := helmTemplateArgs("/r", got[0].words)
	if err != nil || strings.Join(args, " ") != "template chime /r/deploy/kubernetes/chime --kube-version "+kubeVersion+" --set insecure=true" {
		t.Errorf("helmTemplateArgs = %q, %v", args, err)
	}
	if _, err := helmTemplateArgs("/r", strings.Fields("helm install deploy/kubernetes/chime")); err == nil {
		t.Error("helmTemplateArgs accepted a command without a release")
	}
	// The chart refuses what a documented command without security values
	// would install: the check must see that as a failure.
	if out, err := helm(t, "template", "chime", chartDir, "--kube-version", kubeVersion, "--set", "kafka.brokers=k:9092"); err == nil {
		t.Errorf("the chart rendered without security values or insecure=true:\n%s", out)
	}
}
