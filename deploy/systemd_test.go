package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const (
	unitPath    = "systemd/chimed.service"
	envFilePath = "systemd/chimed.env"
)

// unit is a systemd unit file: section -> key -> the values in order.
type unit map[string]map[string][]string

func parseUnit(data string) (unit, error) {
	u := unit{}
	section := ""
	for i, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		case section == "":
			return nil, fmt.Errorf("line %d: %q outside a section", i+1, line)
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return nil, fmt.Errorf("line %d: %q is not KEY=VALUE", i+1, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u, nil
}

func (u unit) get(section, key string) (string, bool) {
	v := u[section][key]
	if len(v) == 0 {
		return "", false
	}
	return v[len(v)-1], true
}

// checkUnit checks the hardening and the stop sequence the issue asks of
// chimed.service.
func checkUnit(data string) error {
	u, err := parseUnit(data)
	if err != nil {
		return err
	}
	var errs []string
	for key, want := range map[string]string{
		"User":                  "chime",
		"EnvironmentFile":       "/etc/chime/chimed.env",
		"ProtectSystem":         "strict",
		"ReadWritePaths":        "/var/lib/chime",
		"StateDirectory":        "chime",
		"NoNewPrivileges":       "yes",
		"PrivateTmp":            "yes",
		"ProtectHome":           "yes",
		"CapabilityBoundingSet": "",
		"LimitNOFILE":           "65536",
		"Restart":               "on-failure",
		"ExecStart":             "/usr/local/bin/chimed serve",
	} {
		if got, ok := u.get("Service", key); !ok || got != want {
			errs = append(errs, fmt.Sprintf("[Service] %s=%q (set %v), want %q", key, got, ok, want))
		}
	}
	stop, _ := u.get("Service", "ExecStop")
	m := regexp.MustCompile(`^-?/usr/local/bin/chimectl .* drain --timeout-drain ([0-9]+)s$`).FindStringSubmatch(stop)
	if m == nil {
		errs = append(errs, fmt.Sprintf("ExecStop %q does not run chimectl ... drain --timeout-drain Ns (no NODE: the node --addr reaches)", stop))
	} else {
		drain, _ := strconv.Atoi(m[1])
		timeout, _ := u.get("Service", "TimeoutStopSec")
		secs, err := strconv.Atoi(timeout)
		// chimed's own graceful shutdown takes up to 30 s after the drain.
		if err != nil || secs < drain+30 {
			errs = append(errs, fmt.Sprintf("TimeoutStopSec=%q does not cover the %d s drain plus chimed's 30 s shutdown", timeout, drain))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

func TestSystemdUnit(t *testing.T) {
	if err := checkUnit(string(readFile(t, unitPath))); err != nil {
		t.Error(err)
	}
}

func TestCheckUnitRejects(t *testing.T) {
	good := string(readFile(t, unitPath))
	for name, bad := range map[string]string{
		"root":                     strings.Replace(good, "User=chime", "User=root", 1),
		"a writable system":        strings.Replace(good, "ProtectSystem=strict", "ProtectSystem=full", 1),
		"capabilities kept":        strings.Replace(good, "CapabilityBoundingSet=\n", "CapabilityBoundingSet=CAP_NET_ADMIN\n", 1),
		"a drain of one node":      strings.Replace(good, "drain --timeout-drain 240s", "drain node-1 --timeout-drain 240s", 1),
		"too short a stop":         strings.Replace(good, "TimeoutStopSec=300", "TimeoutStopSec=90", 1),
		"no file limit":            strings.Replace(good, "LimitNOFILE=65536", "", 1),
		"a line outside a section": "ExecStart=/bin/true\n" + good,
	} {
		if bad == good {
			t.Fatalf("%s: the planted change did not apply", name)
		}
		if err := checkUnit(bad); err == nil {
			t.Errorf("%s: checkUnit accepted it", name)
		}
	}
}

// systemdVerify runs systemd-analyze verify on a copy of the unit whose
// /usr/local/bin/chimed and chimectl are the binaries built for the test
// (verify refuses a unit whose commands do not exist). It returns what
// verify printed: an unknown key, a value it cannot parse, a bad command.
func systemdVerify(t *testing.T, data string) string {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	chimed, chimectl := builtBinaries(t)
	data = strings.ReplaceAll(data, "/usr/local/bin/chimectl", chimectl)
	data = strings.ReplaceAll(data, "/usr/local/bin/chimed", chimed)
	path := filepath.Join(t.TempDir(), "chimed.service")
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(analyze, "verify", path).CombinedOutput()
	return strings.TrimSpace(string(out))
}

func TestSystemdAnalyzeVerify(t *testing.T) {
	if out := systemdVerify(t, string(readFile(t, unitPath))); out != "" {
		t.Errorf("systemd-analyze verify chimed.service:\n%s", out)
	}
	bad := strings.Replace(string(readFile(t, unitPath)), "ProtectHome=yes", "ProtectHom=yes", 1)
	if out := systemdVerify(t, bad); !strings.Contains(out, "ProtectHom") {
		t.Errorf("systemd-analyze verify did not report an unknown key: %q", out)
	}
}

// envFile parses a systemd EnvironmentFile. Commented-out assignments
// (#CHIME_X=...) are returned too, apart: they are choices the file offers,
// and must name real flags as much as the set ones.
func envFile(data string) (set, commented map[string]string) {
	set, commented = map[string]string{}, map[string]string{}
	assign := regexp.MustCompile(`^(#?)([A-Z][A-Z0-9_]*)=(.*)$`)
	for _, line := range strings.Split(data, "\n") {
		if m := assign.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			if m[1] == "#" {
				commented[m[2]] = m[3]
			} else {
				set[m[2]] = m[3]
			}
		}
	}
	return set, commented
}

var unitVar = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// unsetVariables returns the variables the unit's Exec lines expand that
// the environment file does not set: systemd expands an unset one to
// nothing, which would leave ExecStop's --addr without its value.
func unsetVariables(unitData, envData string) ([]string, error) {
	u, err := parseUnit(unitData)
	if err != nil {
		return nil, err
	}
	set, _ := envFile(envData)
	var unset []string
	for key, lines := range u["Service"] {
		if !strings.HasPrefix(key, "Exec") {
			continue
		}
		for _, line := range lines {
			for _, m := range unitVar.FindAllStringSubmatch(line, -1) {
				if _, ok := set[m[1]]; !ok {
					unset = append(unset, key+": "+m[1])
				}
			}
		}
	}
	return unset, nil
}

func TestUnitVariablesSet(t *testing.T) {
	unitData, envData := string(readFile(t, unitPath)), string(readFile(t, envFilePath))
	unset, err := unsetVariables(unitData, envData)
	if err != nil {
		t.Fatal(err)
	}
	if len(unset) > 0 {
		t.Errorf("chimed.service expands variables chimed.env does not set: %v", unset)
	}
	planted := strings.Replace(envData, "\nCHIME_GRPC_ADDR=", "\n#CHIME_GRPC_ADDR=", 1)
	if planted == envData {
		t.Fatal("the planted change did not apply")
	}
	if unset, _ := unsetVariables(unitData, planted); len(unset) != 1 || !strings.Contains(unset[0], "CHIME_GRPC_ADDR") {
		t.Errorf("with CHIME_GRPC_ADDR commented out, unsetVariables = %v", unset)
	}
}

// checkDrainCredential checks what chimed.env gives the unit's ExecStop
// drain: with TLS it verifies the node against the node CA as node.chime and
// authenticates with an admin credential of its own, never the node's
// certificate; with a client CA (which makes the node demand a client
// certificate) that credential is a client certificate; a token never goes
// on the command line (ps and the journal show it). The file must also say
// which names the node's certificate needs: node.chime and
// <node-id>.node.chime.
func checkDrainCredential(envData string) error {
	set, commented := envFile(envData)
	var errs []string
	flags := map[string]string{}
	words := strings.Fields(set["CHIMECTL_FLAGS"])
	for i := 0; i < len(words); i++ {
		name, value, ok := strings.Cut(strings.TrimLeft(words[i], "-"), "=")
		if !ok && i+1 < len(words) && !strings.HasPrefix(words[i+1], "-") {
			i++
			value = words[i]
		}
		flags[name] = value
	}
	if _, ok := flags["token"]; ok {
		errs = append(errs, "CHIMECTL_FLAGS passes --token: ps and the journal show it; set CHIME_TOKEN instead")
	}
	for flag, node := range map[string]string{"tls-cert": "CHIME_TLS_CERT", "tls-key": "CHIME_TLS_KEY"} {
		if v, ok := flags[flag]; ok && set[node] != "" && v == set[node] {
			errs = append(errs, fmt.Sprintf("CHIMECTL_FLAGS --%s %s is the node's own (%s): the drain must use an admin credential of its own", flag, v, node))
		}
	}
	if set["CHIME_TLS_CERT"] != "" {
		if flags["tls-ca"] != set["CHIME_TLS_CA"] || flags["tls-server-name"] != "node.chime" {
			errs = append(errs, fmt.Sprintf("CHIMECTL_FLAGS %q does not verify the node against CHIME_TLS_CA (%s) as node.chime", set["CHIMECTL_FLAGS"], set["CHIME_TLS_CA"]))
		}
		_, cert := flags["tls-cert"]
		_, key := flags["tls-key"]
		switch {
		case cert != key:
			errs = append(errs, "CHIMECTL_FLAGS gives one of --tls-cert and --tls-key without the other")
		case set["CHIME_TLS_CLIENT_CA"] != "" && !cert:
			errs = append(errs, "with CHIME_TLS_CLIENT_CA the node demands a client certificate, and CHIMECTL_FLAGS gives the drain none (--tls-cert, --tls-key)")
		case !cert && set["CHIME_AUTH_FILE"] != "" && set["CHIME_TOKEN"] == "":
			errs = append(errs, "the drain has no credential: neither a client certificate in CHIMECTL_FLAGS nor CHIME_TOKEN")
		}
	}
	if _, ok := commented["CHIME_TOKEN"]; !ok && set["CHIME_TOKEN"] == "" {
		errs = append(errs, "chimed.env does not show the token alternative (#CHIME_TOKEN=) for nodes without a client CA")
	}
	for _, name := range []string{"node.chime", "<node-id>.node.chime"} {
		if !strings.Contains(envData, name+" ") && !strings.Contains(envData, name+"\n") {
			errs = append(errs, fmt.Sprintf("chimed.env does not say that the node's certificate must name %s", name))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

func TestSystemdDrainCredential(t *testing.T) {
	good := string(readFile(t, envFilePath))
	if err := checkDrainCredential(good); err != nil {
		t.Fatal(err)
	}
	set, _ := envFile(good)
	flags := set["CHIMECTL_FLAGS"]
	nodeFlags := "--tls-ca " + set["CHIME_TLS_CA"] + " --tls-cert " + set["CHIME_TLS_CERT"] + " --tls-key " + set["CHIME_TLS_KEY"] + " --tls-server-name node.chime"
	for name, bad := range map[string]string{
		"the drain uses the node's certificate": strings.Replace(good, "CHIMECTL_FLAGS="+flags, "CHIMECTL_FLAGS="+nodeFlags, 1),
		"no client certificate with a client CA": strings.Replace(good, "CHIMECTL_FLAGS="+flags,
			"CHIMECTL_FLAGS=--tls-ca "+set["CHIME_TLS_CA"]+" --tls-server-name node.chime", 1),
		"a token on the command line":     strings.Replace(good, "CHIMECTL_FLAGS="+flags, "CHIMECTL_FLAGS="+flags+" --token secret", 1),
		"the node verified by address":    strings.Replace(good, "CHIMECTL_FLAGS="+flags, "CHIMECTL_FLAGS="+strings.Replace(flags, " --tls-server-name node.chime", "", 1), 1),
		"no word of <node-id>.node.chime": strings.ReplaceAll(good, "<node-id>.node.chime", "its id"),
	} {
		if bad == good {
			t.Fatalf("%s: the planted change did not apply", name)
		}
		if err := checkDrainCredential(bad); err == nil {
			t.Errorf("%s: checkDrainCredential accepted it", name)
		}
	}
}
