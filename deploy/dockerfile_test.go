package deploy

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
)

const dockerfilePath = "docker/Dockerfile"

// instruction is one Dockerfile instruction, its continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ENV, ...
	args string
}

// parseDockerfile splits a Dockerfile into instructions: comments and blank
// lines dropped, lines ending in a backslash joined to the next.
func parseDockerfile(data string) []instruction {
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if body, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		if full := strings.TrimSpace(cur.String()); full != "" {
			cmd, args, _ := strings.Cut(full, " ")
			out = append(out, instruction{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " ")})
		}
		cur.Reset()
	}
	return out
}

// dockerEnv returns the variables ENV instructions set (KEY=VALUE form).
func dockerEnv(ins []instruction) map[string]string {
	env := map[string]string{}
	for _, in := range ins {
		if in.cmd == "ENV" {
			for _, kv := range strings.Fields(in.args) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
	}
	return env
}

// execForm decodes a JSON (exec form) command list, after a prefix such as
// the HEALTHCHECK options and CMD.
func execForm(args string) ([]string, error) {
	var list []string
	if i := strings.Index(args, "["); i >= 0 {
		args = args[i:]
	}
	if err := json.Unmarshal([]byte(args), &list); err != nil {
		return nil, fmt.Errorf("%q is not an exec-form list: %w", args, err)
	}
	return list, nil
}

// checkDockerfile checks what the issue asks of the image: a static build
// in a golang stage, distroless nonroot at the end, the data volume, the
// ports, the CHIME_* listen addresses, the health check, and chimed serve as
// what runs.
func checkDockerfile(data string) error {
	ins := parseDockerfile(data)
	var errs []string
	var froms []string
	last := map[string]string{}
	var runs []string
	for _, in := range ins {
		switch in.cmd {
		case "FROM":
			froms = append(froms, in.args)
		case "RUN":
			runs = append(runs, in.args)
		}
		last[in.cmd] = in.args
	}
	if len(froms) != 2 || !strings.HasPrefix(froms[0], "golang:1.26 ") || froms[1] != "gcr.io/distroless/static-debian12:nonroot" {
		errs = append(errs, fmt.Sprintf("stages %q, want golang:1.26 then gcr.io/distroless/static-debian12:nonroot", froms))
	}
	built := false
	for _, r := range runs {
		if strings.Contains(r, "CGO_ENABLED=0 go build -trimpath") && strings.Contains(r, "./cmd/chimed ./cmd/chimectl") {
			built = true
		}
	}
	if !built {
		errs = append(errs, "no RUN builds ./cmd/chimed ./cmd/chimectl with CGO_ENABLED=0 go build -trimpath")
	}
	if last["USER"] != "nonroot" {
		errs = append(errs, fmt.Sprintf("USER %q, want nonroot", last["USER"]))
	}
	if !strings.Contains(last["VOLUME"], "/var/lib/chime") {
		errs = append(errs, fmt.Sprintf("VOLUME %q, want /var/lib/chime", last["VOLUME"]))
	}
	var ports []string
	for _, p := range strings.Fields(last["EXPOSE"]) {
		if !strings.Contains(p, "/") {
			p += "/tcp"
		}
		ports = append(ports, p)
	}
	sort.Strings(ports)
	if got := strings.Join(ports, " "); got != "7070/tcp 7071/tcp 7072/tcp 7072/udp 7080/tcp" {
		errs = append(errs, fmt.Sprintf("EXPOSE %s, want 7070 7071 7072/tcp 7072/udp 7080", got))
	}
	env := dockerEnv(ins)
	for k, v := range map[string]string{"CHIME_DATA_DIR": "/var/lib/chime", "CHIME_GRPC_ADDR": "0.0.0.0:7070",
		"CHIME_RAFT_ADDR": "0.0.0.0:7071", "CHIME_GOSSIP_ADDR": "0.0.0.0:7072", "CHIME_HTTP_ADDR": "0.0.0.0:7080"} {
		if env[k] != v {
			errs = append(errs, fmt.Sprintf("ENV %s=%q, want %q", k, env[k], v))
		}
	}
	for cmd, want := range map[string]string{"HEALTHCHECK": "/usr/local/bin/chimed health", "ENTRYPOINT": "/usr/local/bin/chimed", "CMD": "serve"} {
		list, err := execForm(last[cmd])
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", cmd, err))
		} else if strings.Join(list, " ") != want {
			errs = append(errs, fmt.Sprintf("%s %q, want %q", cmd, list, want))
		}
	}
	if !strings.Contains(last["COPY"]+" "+strings.Join(copies(ins), " "), "/out/chimed /out/chimectl /usr/local/bin/") {
		errs = append(errs, "chimed and chimectl are not copied to /usr/local/bin/")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

func copies(ins []instruction) []string {
	var out []string
	for _, in := range ins {
		if in.cmd == "COPY" {
			out = append(out, in.args)
		}
	}
	return out
}

func TestDockerfile(t *testing.T) {
	if err := checkDockerfile(string(readFile(t, dockerfilePath))); err != nil {
		t.Error(err)
	}
}

func TestCheckDockerfileRejects(t *testing.T) {
	good := string(readFile(t, dockerfilePath))
	for name, bad := range map[string]string{
		"root":                 strings.Replace(good, "USER nonroot", "USER root", 1),
		"a cgo build":          strings.Replace(good, "CGO_ENABLED=0 go build", "go build", 1),
		"another base":         strings.Replace(good, "gcr.io/distroless/static-debian12:nonroot", "debian:12", 1),
		"no UDP gossip":        strings.Replace(good, "7072/udp ", "", 1),
		"loopback listening":   strings.Replace(good, "CHIME_GRPC_ADDR=0.0.0.0:7070", "CHIME_GRPC_ADDR=127.0.0.1:7070", 1),
		"a shell health check": strings.Replace(good, `CMD ["/usr/local/bin/chimed", "health"]`, "CMD curl -f http://localhost:7080/healthz", 1),
	} {
		if bad == good {
			t.Fatalf("%s: the planted change did not apply", name)
		}
		if err := checkDockerfile(bad); err == nil {
			t.Errorf("%s: checkDockerfile accepted it", name)
		}
	}
}

func TestParseDockerfileJoinsContinuations(t *testing.T) {
	got := parseDockerfile("# c\nENV A=1 \\\n    B=2\n\nRUN x \\\n  # inner comment\n  y\nUSER me\n")
	want := []instruction{{"ENV", "A=1 B=2"}, {"RUN", "x y"}, {"USER", "me"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseDockerfile = %v, want %v", got, want)
	}
}
