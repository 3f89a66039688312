package deploy

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/certs/certstest"
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
		if _, err := fmt.Sscan(m2[1], &n); err != nil {
			t.Errorf("preStop's --timeout-drain %q: %v", m2[1], err)
		}
		var shutdown int64
		if _, err := fmt.Sscan(strings.TrimSuffix(args["--shutdown-timeout"], "s"), &shutdown); err != nil {
			t.Errorf("--shutdown-timeout %q: %v", args["--shutdown-timeout"], err)
		}
		if pod.TerminationGracePeriodSeconds == nil {
			t.Error("no terminationGracePeriodSeconds")
		} else if grace := *pod.TerminationGracePeriodSeconds; n+shutdown >= grace {
			t.Errorf("drain %d s plus shutdown %d s do not fit terminationGracePeriodSeconds %d", n, shutdown, grace)
		}
	}
	if got := strings.Contains(drain, "--tls-server-name node.chime"); got != secure {
		t.Errorf("preStop %q: TLS flags present %v, want %v", drain, got, secure)
	}
	for _, problem := range checkDrain(c, secure) {
		t.Error(problem)
	}
	if secure {
		for _, problem := range checkNodeTLS(t.TempDir(), sts) {
			t.Error(problem)
		}
	}
	if _, insecure := args["--insecure"]; insecure == secure {
		t.Errorf("--insecure given %v with the %s values", insecure, set)
	}

	// Every file a flag names is on a mounted volume: a Secret, the pod's
	// own certificate from the csi-driver, or the data volume.
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
		} else if v := volumes[name]; v.Secret == nil && v.CSI == nil {
			t.Errorf("%s is on volume %s, which is neither a Secret nor the csi-driver's certificate", f, name)
		}
	}
	var secrets []string
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secrets = append(secrets, v.Secret.SecretName)
		}
	}
	// No TLS Secret: each pod's certificate is its own, from the csi-driver.
	wantSecrets := map[string]string{"insecure": "", "secure": "chime-auth chime-gossip chime-kafka-tls"}[set]
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

// csiDriver is cert-manager's csi-driver, which issues each pod a
// certificate of its own.
const csiDriver = "csi.cert-manager.io"

// checkDrain checks the preStop drain's credentials and returns what is
// wrong: it never presents the node's certificate (or any), verifies the
// node as node.chime when TLS is on, and with the secure values (an auth
// file) sends the drain's own admin token, from its Secret, as CHIME_TOKEN
// (never on the command line, which ps shows).
func checkDrain(c corev1.Container, secure bool) []string {
	var problems []string
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil {
		return []string{"no preStop exec hook"}
	}
	cmd := c.Lifecycle.PreStop.Exec.Command
	drain := " " + strings.Join(cmd, " ") + " "
	for _, f := range flagsIn(cmd) {
		if f == "tls-cert" || f == "tls-key" || f == "token" {
			problems = append(problems, fmt.Sprintf("preStop %q passes --%s: the drain presents no certificate (the node's key is its identity to its peers) and its token comes from CHIME_TOKEN", drain, f))
		}
	}
	if strings.Contains(drain, "tls.key") || strings.Contains(drain, "tls.crt") {
		problems = append(problems, fmt.Sprintf("preStop %q names the node's certificate or key", drain))
	}
	if secure && !strings.Contains(drain, " --tls-ca /etc/chime/tls/ca.crt ") {
		problems = append(problems, fmt.Sprintf("preStop %q does not verify the node against the node CA (--tls-ca /etc/chime/tls/ca.crt)", drain))
	}
	var token *corev1.EnvVar
	for i, e := range c.Env {
		if e.Name == "CHIME_TOKEN" {
			token = &c.Env[i]
		}
	}
	switch {
	case !secure && token != nil:
		problems = append(problems, "CHIME_TOKEN is set without an auth file")
	case secure && token == nil:
		problems = append(problems, "no CHIME_TOKEN: with an auth file the preStop drain has no credential of its own")
	case secure && (token.ValueFrom == nil || token.ValueFrom.SecretKeyRef == nil || token.Value != ""):
		problems = append(problems, fmt.Sprintf("CHIME_TOKEN %+v does not come from a Secret", *token))
	case secure:
		if ref := token.ValueFrom.SecretKeyRef; ref.Name != "chime-drain" || ref.Key != "token" {
			problems = append(problems, fmt.Sprintf("CHIME_TOKEN comes from Secret %s key %s, want the drain credential chime-drain key token", ref.Name, ref.Key))
		}
	}
	return problems
}

// checkNodeTLS checks, for the secure values, that every pod of sts gets a
// certificate of its own that chimed accepts for its --node-id and for no
// other pod's, and that no Secret shared by the pods carries node TLS. For
// each pod it expands the csi-driver's attributes as the driver does
// (${POD_NAME}, ${POD_NAMESPACE}), issues a certificate with those DNS names
// and key usages from a throwaway CA in dir, and runs chimed's own check on
// it (certs.CheckNode). It returns what is wrong.
func checkNodeTLS(dir string, sts *appsv1.StatefulSet) []string {
	var problems []string
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		return []string{fmt.Sprintf("%d containers, want 1", len(pod.Containers))}
	}
	c := pod.Containers[0]
	args := map[string]string{}
	for _, a := range c.Args {
		name, value, _ := strings.Cut(a, "=")
		args[name] = value
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	// The files of --tls-cert, --tls-key and --tls-ca are on the one CSI
	// volume.
	var csi *corev1.CSIVolumeSource
	for _, flag := range []string{"--tls-cert", "--tls-key", "--tls-ca"} {
		f, ok := args[flag]
		if !ok {
			problems = append(problems, fmt.Sprintf("no %s", flag))
			continue
		}
		m, ok := mounts[filepath.Dir(f)]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s=%s is on no volume mount", flag, f))
			continue
		}
		v := volumes[m.Name]
		if v.Secret != nil || v.CSI == nil || v.CSI.Driver != csiDriver {
			problems = append(problems, fmt.Sprintf("%s=%s is on volume %s, which is not the %s volume of the pod's own certificate (%+v)", flag, f, m.Name, csiDriver, v.VolumeSource))
			continue
		}
		if !m.ReadOnly || v.CSI.ReadOnly == nil || !*v.CSI.ReadOnly {
			problems = append(problems, fmt.Sprintf("the certificate volume %s is not mounted read-only", m.Name))
		}
		csi = v.CSI
	}
	if csi == nil {
		return problems
	}
	attr := csi.VolumeAttributes
	for key, want := range map[string]string{
		"csi.cert-manager.io/issuer-name":  "chime-nodes",
		"csi.cert-manager.io/issuer-kind":  "Issuer",
		"csi.cert-manager.io/issuer-group": "cert-manager.io",
		"csi.cert-manager.io/duration":     "2160h",
	} {
		if attr[key] != want {
			problems = append(problems, fmt.Sprintf("volume attribute %s=%q, want %q", key, attr[key], want))
		}
	}
	// The driver writes the files 0440, owned by root and by the group
	// fs-group names: chimed's group must be it.
	if sc := pod.SecurityContext; sc == nil || sc.RunAsGroup == nil || attr["csi.cert-manager.io/fs-group"] != fmt.Sprint(*sc.RunAsGroup) {
		problems = append(problems, fmt.Sprintf("csi.cert-manager.io/fs-group=%q is not the group chimed runs as: it could not read its key", attr["csi.cert-manager.io/fs-group"]))
	}
	var usages []x509.ExtKeyUsage
	for _, u := range strings.Split(attr["csi.cert-manager.io/key-usages"], ",") {
		switch strings.TrimSpace(u) {
		case "server auth":
			usages = append(usages, x509.ExtKeyUsageServerAuth)
		case "client auth":
			usages = append(usages, x509.ExtKeyUsageClientAuth)
		}
	}

	ca, err := certstest.NewCA(dir, "nodes")
	if err != nil {
		return append(problems, err.Error())
	}
	replicas := 1
	if sts.Spec.Replicas != nil {
		replicas = int(*sts.Spec.Replicas)
	}
	for i := 0; i < replicas; i++ {
		podName := fmt.Sprintf("%s-%d", sts.Name, i)
		// The kubelet expands $(VAR) in args; the csi-driver ${VAR} (os.Expand).
		kubelet := strings.NewReplacer("$(POD_NAME)", podName, "$(POD_NAMESPACE)", namespace)
		var unknown []string
		expand := func(s string) string {
			return os.Expand(s, func(v string) string {
				switch v {
				case "POD_NAME":
					return podName
				case "POD_NAMESPACE":
					return namespace
				}
				unknown = append(unknown, v)
				return ""
			})
		}
		dns := strings.Split(expand(attr["csi.cert-manager.io/dns-names"]), ",")
		if len(unknown) > 0 {
			problems = append(problems, fmt.Sprintf("dns-names expand variables the csi-driver does not set: %v", unknown))
		}
		id := kubelet.Replace(args["--node-id"])
		if id != podName {
			problems = append(problems, fmt.Sprintf("pod %s: --node-id is %q, not the pod's name", podName, id))
		}
		for _, want := range []string{"node.chime", podName + ".node.chime", kubelet.Replace(args["--advertise-host"]), "chime.example.com"} {
			if !slices.Contains(dns, want) {
				problems = append(problems, fmt.Sprintf("pod %s: the certificate's DNS names %v lack %s", podName, dns, want))
			}
		}
		pair, err := ca.Issue(expand(attr["csi.cert-manager.io/common-name"]), dns, usages...)
		if err != nil {
			return append(problems, err.Error())
		}
		src, err := certs.Load(certs.Files{Cert: pair.Cert, Key: pair.Key, CA: ca.File}, nil)
		if err != nil {
			return append(problems, err.Error())
		}
		if err := src.CheckNode(id); err != nil {
			problems = append(problems, fmt.Sprintf("pod %s: chimed would refuse its certificate: %v", podName, err))
		}
		// The certificate speaks for this pod alone.
		other := fmt.Sprintf("%s-%d", sts.Name, (i+1)%max(replicas, 2))
		if err := src.CheckNode(other); err == nil {
			problems = append(problems, fmt.Sprintf("pod %s: its certificate would also start node %s", podName, other))
		}
	}
	return problems
}

// TestChartChecksCatch: checkDrain and checkNodeTLS find what they are for,
// planted in the secure render: a drain that uses the node's key or has no
// token, certificates that name another node or are shared, a key chimed
// cannot read.
func TestChartChecksCatch(t *testing.T) {
	good := renderSet(t, "secure").statefulSets[0]
	if p := append(checkDrain(good.Spec.Template.Spec.Containers[0], true), checkNodeTLS(t.TempDir(), good)...); len(p) > 0 {
		t.Fatalf("the secure render itself fails the checks: %v", p)
	}
	tlsVolume := func(s *appsv1.StatefulSet) *corev1.Volume {
		for i, v := range s.Spec.Template.Spec.Volumes {
			if v.Name == "tls" {
				return &s.Spec.Template.Spec.Volumes[i]
			}
		}
		t.Fatal("no tls volume")
		return nil
	}
	setDNS := func(f func(string) string) func(*appsv1.StatefulSet) {
		return func(s *appsv1.StatefulSet) {
			a := tlsVolume(s).CSI.VolumeAttributes
			a["csi.cert-manager.io/dns-names"] = f(a["csi.cert-manager.io/dns-names"])
		}
	}
	for name, c := range map[string]struct {
		plant func(*appsv1.StatefulSet)
		drain bool // checkDrain must catch it, else checkNodeTLS
	}{
		"the drain presents the node's certificate": {func(s *appsv1.StatefulSet) {
			pre := s.Spec.Template.Spec.Containers[0].Lifecycle.PreStop.Exec
			pre.Command = append([]string{pre.Command[0], "--tls-cert", "/etc/chime/tls/tls.crt", "--tls-key", "/etc/chime/tls/tls.key"}, pre.Command[1:]...)
		}, true},
		"the drain has no token": {func(s *appsv1.StatefulSet) {
			c := &s.Spec.Template.Spec.Containers[0]
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "CHIME_TOKEN" })
		}, true},
		"the drain's token on its command line": {func(s *appsv1.StatefulSet) {
			pre := s.Spec.Template.Spec.Containers[0].Lifecycle.PreStop.Exec
			pre.Command = append([]string{pre.Command[0], "--token", "secret"}, pre.Command[1:]...)
		}, true},
		"every pod's certificate names pod 0": {setDNS(func(d string) string {
			return strings.Replace(d, "${POD_NAME}.node.chime", "chime-0.node.chime", 1)
		}), false},
		"certificates name a second node id": {setDNS(func(d string) string { return d + ",chime-1.node.chime" }), false},
		"certificates lack node.chime":       {setDNS(func(d string) string { return strings.Replace(d, ",node.chime,", ",", 1) }), false},
		"certificates without client use": {func(s *appsv1.StatefulSet) {
			tlsVolume(s).CSI.VolumeAttributes["csi.cert-manager.io/key-usages"] = "server auth,digital signature,key encipherment"
		}, false},
		"a key chimed's group cannot read": {func(s *appsv1.StatefulSet) {
			delete(tlsVolume(s).CSI.VolumeAttributes, "csi.cert-manager.io/fs-group")
		}, false},
		"one TLS Secret shared by every pod": {func(s *appsv1.StatefulSet) {
			tlsVolume(s).VolumeSource = corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "chime-tls"}}
		}, false},
	} {
		s := good.DeepCopy()
		c.plant(s)
		var problems []string
		if c.drain {
			problems = checkDrain(s.Spec.Template.Spec.Containers[0], true)
		} else {
			problems = checkNodeTLS(t.TempDir(), s)
		}
		if len(problems) == 0 {
			t.Errorf("%s: the checks found nothing", name)
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
			[]string{"refusing to render", "missing: tls.certManagerCSI.issuerName, auth.secretName, gossip.secretName", "node.chime", "POD.node.chime", "insecure=true"}},
		"TLS and auth without gossip keys": {[]string{"--set", "kafka.brokers=k:9092", "--set", "tls.certManagerCSI.issuerName=i", "--set", "auth.secretName=a"},
			[]string{"refusing to render", "missing: gossip.secretName"}},
		"TLS, and Kafka in plaintext": {[]string{"--set", "kafka.brokers=k:9092", "--set", "tls.certManagerCSI.issuerName=i", "--set", "auth.secretName=a", "--set", "gossip.secretName=g", "--set", "drain.credential.secretName=d"},
			[]string{"produce to Kafka in plaintext", "kafka.tls.enabled=true", "kafka.insecure=true"}},
		"auth without TLS": {[]string{"--set", "kafka.brokers=k:9092", "--set", "insecure=true", "--set", "auth.secretName=a"},
			[]string{"auth.secretName needs TLS (tls.certManagerCSI.issuerName)"}},
		// One Secret in every pod: no certificate can name each pod's node
		// id, and any pod's key would speak as any other.
		"a TLS Secret shared by every pod": {[]string{"-f", valuesFile("secure"), "--set", "tls.secretName=chime-tls"},
			[]string{"refusing to render tls.secretName=chime-tls", "<node-id>.node.chime", "chime-0.node.chime", "tls.certManagerCSI.issuerName", "csi.cert-manager.io"}},
		"only the shared TLS Secret of old": {[]string{"--set", "kafka.brokers=k:9092", "--set", "tls.secretName=chime-tls", "--set", "auth.secretName=a", "--set", "gossip.secretName=g"},
			[]string{"refusing to render tls.secretName=chime-tls", "tls.certManagerCSI.issuerName"}},
		"per-pod Secrets by prefix": {[]string{"-f", valuesFile("secure"), "--set", "tls.perPodSecretPrefix=chime-tls"},
			[]string{"tls.perPodSecretPrefix is not a value of this chart", "tls.certManagerCSI"}},
		// The preStop drain must authenticate, and not with the node's key.
		"secured without a drain credential": {[]string{"-f", valuesFile("secure"), "--set", "drain.credential.secretName="},
			[]string{"drain.credential.secretName is empty", "does not use the node's key", "role admin", "chime-auth"}},
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
	if err := os.WriteFile(a, []byte("groups: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte("groups: [] \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sameFile(a, b); err == nil {
		t.Error("sameFile accepted two different files")
	}
	if err := sameFile(a, a); err != nil {
		t.Errorf("sameFile refused a file and itself: %v", err)
	}
}
