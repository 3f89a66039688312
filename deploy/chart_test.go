package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "kubernetes/chime"
	namespace = "chime-test"
	// helm's own default when it cannot ask a cluster is v1.20.0 (a
	// go-installed helm is not stamped with a Kubernetes version), older
	// than the chart's kubeVersion; the checks render for a current one.
	kubeVersion = "1.33.0"
)

// render runs helm template on the chart with the given flags (-f, --set).
func render(t *testing.T, flags ...string) (string, error) {
	t.Helper()
	return helm(t, append([]string{"template", "chime", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, flags...)...)
}

// valueSets are the chart's example values the checks render: the smallest
// install, and a production-shaped one (TLS, tokens, gossip keys, Kafka TLS
// and SASL, required anti-affinity).
var valueSets = []string{"insecure", "secure"}

func valuesFile(name string) string { return filepath.Join(chartDir, "ci", name+"-values.yaml") }

// renderSet renders the chart with value set name and decodes every
// manifest strictly, failing the test if either step fails.
func renderSet(t *testing.T, name string) *manifests {
	t.Helper()
	out, err := render(t, "-f", valuesFile(name))
	if err != nil {
		t.Fatalf("helm template -f %s: %v\n%s", valuesFile(name), err, out)
	}
	m, err := decodeManifests(out)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// manifests is a rendered chart decoded into the Kubernetes API types.
type manifests struct {
	statefulSets []*appsv1.StatefulSet
	services     []*corev1.Service
	configMaps   []*corev1.ConfigMap
	pdbs         []*policyv1.PodDisruptionBudget
}

// decodeManifests decodes every document of a multi-document YAML stream
// strictly into the API type of its apiVersion and kind: an unknown kind,
// an unknown or misplaced field, or a value of the wrong type is an error.
func decodeManifests(stream string) (*manifests, error) {
	m := &manifests{}
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(stream, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 StatefulSet":
			o := &appsv1.StatefulSet{}
			m.statefulSets, obj = append(m.statefulSets, o), o
		case "v1 Service":
			o := &corev1.Service{}
			m.services, obj = append(m.services, o), o
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			m.configMaps, obj = append(m.configMaps, o), o
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			m.pdbs, obj = append(m.pdbs, o), o
		default:
			return nil, fmt.Errorf("document %d: no API type known for apiVersion %q kind %q", i, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s %s): %w", i, meta.APIVersion, meta.Kind, err)
		}
	}
	return m, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func TestDecodeManifestsIsStrict(t *testing.T) {
	good := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n"
	if _, err := decodeManifests("# Source: x\n---\n" + good); err != nil {
		t.Fatalf("a valid ConfigMap: %v", err)
	}
	for name, bad := range map[string]string{
		"an unknown field":   good + "datta:\n  k: v\n",
		"a misplaced field":  strings.Replace(good, "  name: a\n", "  name: a\n  replicas: 3\n", 1),
		"a wrong type":       strings.Replace(good, "  k: v\n", "  k: [v]\n", 1),
		"an unknown kind":    strings.Replace(good, "kind: ConfigMap", "kind: PrometheusRule", 1),
		"a wrong apiVersion": strings.Replace(good, "apiVersion: v1", "apiVersion: apps/v1", 1),
		"a duplicate key":    good + "data:\n  k: w\n",
	} {
		if _, err := decodeManifests(good + "---\n" + bad); err == nil {
			t.Errorf("%s: decodeManifests accepted it", name)
		}
	}
}

// TestChartRenders renders the chart with each value set, decodes every
// manifest strictly, and checks what the chart promises of them.
func TestChartRenders(t *testing.T) {
	for _, set := range valueSets {
		t.Run(set, func(t *testing.T) {
			checkRendered(t, set, renderSet(t, set))
		})
	}
}

func checkRendered(t *testing.T, set string, m *manifests) {
	t.Helper()
	if len(m.statefulSets) != 1 || len(m.services) != 2 || len(m.pdbs) != 1 || len(m.configMaps) != 2 {
		t.Fatalf("rendered %d StatefulSets, %d Services, %d PodDisruptionBudgets, %d ConfigMaps; want 1, 2, 1, 2",
			len(m.statefulSets), len(m.services), len(m.pdbs), len(m.configMaps))
	}
	sts := m.statefulSets[0]
	secure := set == "secure"
	headless := sts.Name + "-headless"

	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q, want Parallel: with OrderedReady a cluster that lost every pod at once never comes back", sts.Spec.PodManagementPolicy)
	}
	if sts.Spec.ServiceName != headless {
		t.Errorf("serviceName %q, want %q", sts.Spec.ServiceName, headless)
	}
	services := map[string]*corev1.Service{}
	for _, s := range m.services {
		services[s.Name] = s
	}
	if h := services[headless]; h == nil {
		t.Errorf("no headless Service %s", headless)
	} else {
		if h.Spec.ClusterIP != corev1.ClusterIPNone || !h.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s: clusterIP %q, publishNotReadyAddresses %v; want None, true", headless, h.Spec.ClusterIP, h.Spec.PublishNotReadyAddresses)
		}
		checkPorts(t, h, "grpc/TCP/7070", "raft/TCP/7071", "gossip/TCP/7072", "gossip-udp/UDP/7072", "http/TCP/7080")
	}
	if c := services[sts.Name]; c == nil {
		t.Errorf("no client Service %s", sts.Name)
	} else {
		checkPorts(t, c, "grpc/TCP/7070", "http/TCP/7080")
	}
	if mu := m.pdbs[0].Spec.MaxUnavailable; mu == nil || mu.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", mu)
	}

	pod := sts.Spec.Template.Spec
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Error("enableServiceLinks is not false: the client Service's link variables (CHIME_SERVICE_HOST, ...) would reach chimed as CHIME_* settings")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	args := map[string]string{}
	for _, a := range c.Args[1:] {
		name, value, _ := strings.Cut(a, "=")
		args[name] = value
	}
	if c.Args[0] != "serve" {
		t.Errorf("args start %q, want serve", c.Args[0])
	}
	dns := "$(POD_NAME)." + headless + ".$(POD_NAMESPACE).svc.cluster.local"
	for flag, want := range map[string]string{
		"--node-id":        "$(POD_NAME)",
		"--advertise-host": dns,
		"--join":           sts.Name + "-0." + headless + "." + namespace + ".svc.cluster.local:7072",
		"--data-dir":       "/var/lib/chime",
		"--grpc-addr":      "0.0.0.0:7070",
		"--raft-addr":      "0.0.0.0:7071",
		"--gossip-addr":    "0.0.0.0:7072",
		"--http-addr":      "0.0.0.0:7080",
	} {
		if args[flag] != want {
			t.Errorf("%s=%q, want %q", flag, args[flag], want)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for name, path := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"} {
		if e := env[name]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
			t.Errorf("env %s is not the pod's %s", name, path)
		}
	}
	// 85% of the memory limit (1Gi insecure, 2Gi secure).
	wantGoMemLimit := map[string]string{"insecure": "870MiB", "secure": "1740MiB"}[set]
	if env["GOMEMLIMIT"].Value != wantGoMemLimit {
		t.Errorf("GOMEMLIMIT %q, want %q", env["GOMEMLIMIT"].Value, wantGoMemLimit)
	}

	scheme := map[bool]corev1.URIScheme{false: corev1.URISchemeHTTP, true: corev1.URISchemeHTTPS}[secure]
	for name, p := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{"readiness": {c.ReadinessProbe, "/readyz?voter=1"}, "liveness": {c.LivenessProbe, "/healthz"}, "startup": {c.StartupProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s httpGet probe", name)
			continue
		}
		if g := p.probe.HTTPGet; g.Path != p.path || g.Scheme != scheme || g.Port.String() != "http" {
			t.Errorf("%s probe GETs %s %s on port %s, want %s %s on http", name, g.Scheme, g.Path, g.Port.String(), scheme, p.path)
		}
	}

	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil {
		t.Fatal("no preStop exec hook")
	}
	pre := c.Lifecycle.PreStop.Exec.Command
	drain := strings.Join(pre, " ")
	if !strings.HasPrefix(drain, "/usr/local/bin/chimectl --addr 127.0.0.1:7070 ") {
		t.Errorf("preStop %q does not run chimectl against the node's own gRPC port", drain)
	}
	m2 := regexp.MustCompile(` drain --timeout-drain ([0-9]+)s$`).FindStringSubmatch(drain)
	if m2 == nil {
		t.Errorf("preStop %q does not end with drain --timeout-drain Ns (no NODE argument)", drain)
	} else {
		var n int64
		fmt.Sscan(m2[1], &n)
		var shutdown int64
		fmt.Sscan(strings.TrimSuffix(args["--shutdown-timeout"], "s"), &shutdown)
		if pod.TerminationGracePeriodSeconds == nil {
			t.Error("no terminationGracePeriodSeconds")
		} else if grace := *pod.TerminationGracePeriodSeconds; n+shutdown >= grace {
			t.Errorf("drain %d s plus shutdown %d s do not fit terminationGracePeriodSeconds %d", n, shutdown, grace)
		}
	}
	if got := strings.Contains(drain, "--tls-server-name node.chime"); got != secure {
		t.Errorf("preStop %q: TLS flags present %v, want %v", drain, got, secure)
	}
	if _, insecure := args["--insecure"]; insecure == secure {
		t.Errorf("--insecure given %v with the %s values", insecure, set)
	}

	// Every file a flag names is on a mounted volume: a Secret, or the data
	// volume.
	mounts := map[string]string{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.MountPath] = vm.Name
	}
	files := append([]string(nil), pre...)
	for _, a := range c.Args {
		if _, v, ok := strings.Cut(a, "="); ok {
			files = append(files, v)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, f := range files {
		if !strings.HasPrefix(f, "/etc/chime/") {
			continue
		}
		name, ok := mounts[filepath.Dir(f)]
		if !ok {
			t.Errorf("%s is on no volume mount", f)
		} else if v := volumes[name]; v.Secret == nil {
			t.Errorf("%s is on volume %s, which is not a Secret", f, name)
		}
	}
	var secrets []string
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secrets = append(secrets, v.Secret.SecretName)
		}
	}
	wantSecrets := map[string]string{"insecure": "", "secure": "chime-tls chime-auth chime-gossip chime-kafka-tls"}[set]
	if strings.Join(secrets, " ") != wantSecrets {
		t.Errorf("Secret volumes %v, want %q", secrets, wantSecrets)
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || mounts["/var/lib/chime"] != sts.Spec.VolumeClaimTemplates[0].Name {
		t.Errorf("the data directory is not on the volume claim template")
	}

	psc, sc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("security context is not non-root, read-only root, no privilege escalation, all capabilities dropped: pod %+v, container %+v", psc, sc)
	}
	if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
		t.Errorf("resources lack a memory limit or requests: %+v", c.Resources)
	}

	aa := pod.Affinity
	if aa == nil || aa.PodAntiAffinity == nil {
		t.Fatal("no pod anti-affinity")
	}
	required := len(aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0
	preferred := len(aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0
	if required != secure || preferred == secure {
		t.Errorf("anti-affinity required %v, preferred %v with the %s values", required, preferred, set)
	}

	// The ConfigMaps carry the very files deploy/ holds.
	data := map[string]string{}
	for _, cm := range m.configMaps {
		for k, v := range cm.Data {
			data[k] = v
		}
	}
	for key, path := range map[string]string{"alerts.yml": "prometheus/alerts.yml", "chime.json": "grafana/chime.json"} {
		if data[key] != string(readFile(t, path)) {
			t.Errorf("the chart's ConfigMap %s differs from %s", key, path)
		}
	}
}

func checkPorts(t *testing.T, s *corev1.Service, want ...string) {
	t.Helper()
	var got []string
	for _, p := range s.Spec.Ports {
		got = append(got, fmt.Sprintf("%s/%s/%d", p.Name, p.Protocol, p.Port))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("Service %s ports %v, want %v", s.Name, got, want)
	}
}

func TestChartLint(t *testing.T) {
	for _, set := range valueSets {
		if out, err := helm(t, "lint", "--strict", chartDir, "--kube-version", kubeVersion, "-f", valuesFile(set)); err != nil {
			t.Errorf("helm lint --strict -f %s: %v\n%s", valuesFile(set), err, out)
		}
	}
}

// TestChartRefuses: the chart fails to render, saying what to give, rather
// than producing nodes chimed refuses or anyone could use.
func TestChartRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		flags []string
		want  []string
	}{
		"no security and not insecure": {[]string{"--set", "kafka.brokers=k:9092"},
			[]string{"refusing to render", "missing: tls.secretName, auth.secretName, gossip.secretName", "node.chime", "insecure=true"}},
		"TLS and auth without gossip keys": {[]string{"--set", "kafka.brokers=k:9092", "--set", "tls.secretName=t", "--set", "auth.secretName=a"},
			[]string{"refusing to render", "missing: gossip.secretName"}},
		"TLS, and Kafka in plaintext": {[]string{"--set", "kafka.brokers=k:9092", "--set", "tls.secretName=t", "--set", "auth.secretName=a", "--set", "gossip.secretName=g"},
			[]string{"produce to Kafka in plaintext", "kafka.tls.enabled=true", "kafka.insecure=true"}},
		"auth without TLS": {[]string{"--set", "kafka.brokers=k:9092", "--set", "insecure=true", "--set", "auth.secretName=a"},
			[]string{"auth.secretName needs tls.secretName"}},
		"no brokers": {[]string{"--set", "insecure=true"},
			[]string{"kafka.brokers is required"}},
		"grace shorter than the drain": {[]string{"-f", valuesFile("insecure"), "--set", "terminationGracePeriodSeconds=60"},
			[]string{"terminationGracePeriodSeconds (60) must exceed drain.timeoutSeconds (240) plus shutdownTimeoutSeconds (30)"}},
		"an anti-affinity mode it does not know": {[]string{"-f", valuesFile("insecure"), "--set", "antiAffinity=soft"},
			[]string{`antiAffinity is "soft"`}},
		"a memory limit it cannot read": {[]string{"-f", valuesFile("insecure"), "--set", "resources.limits.memory=1.5G"},
			[]string{`resources.limits.memory is "1.5G"`}},
	} {
		_, err := render(t, c.flags...)
		if err == nil {
			t.Errorf("%s: rendered", name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: the failure does not say %q:\n%v", name, w, err)
			}
		}
	}
}

// TestChartCopiesMatch: Helm reads only files inside the chart, so the
// chart carries copies of the alerts and the dashboard; they must stay the
// files deploy/prometheus and deploy/grafana hold.
func TestChartCopiesMatch(t *testing.T) {
	for copyPath, orig := range map[string]string{
		chartDir + "/files/alerts.yml": "prometheus/alerts.yml",
		chartDir + "/files/chime.json": "grafana/chime.json",
	} {
		if err := sameFile(copyPath, orig); err != nil {
			t.Error(err)
		}
	}
}

func sameFile(copyPath, orig string) error {
	a, err := os.ReadFile(copyPath)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(orig)
	if err != nil {
		return err
	}
	if !bytes.Equal(a, b) {
		return fmt.Errorf("%s differs from %s: cp deploy/%s deploy/%s", copyPath, orig, orig, copyPath)
	}
	return nil
}

func TestSameFileDetectsADifference(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("groups: []\n"), 0o644)
	os.WriteFile(b, []byte("groups: [] \n"), 0o644)
	if err := sameFile(a, b); err == nil {
		t.Error("sameFile accepted two different files")
	}
	if err := sameFile(a, a); err != nil {
		t.Errorf("sameFile refused a file and itself: %v", err)
	}
}
