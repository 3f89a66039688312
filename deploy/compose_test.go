package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

const composeDir = "compose"

// loadCompose loads a compose file with compose-spec's loader as docker
// compose does: validated against the compose-spec schema (an unknown field
// is an error), interpolated, with relative paths resolved against the
// file's directory.
func loadCompose(dir string, content []byte) (*types.Project, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  abs,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(abs, "compose.yaml"), Content: content}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) {
		o.SetProjectName("chime", true)
		o.ResolvePaths = true
	})
}

// missingSources returns the bind-mounted files and directories, build
// contexts and Dockerfiles a project names that do not exist.
func missingSources(p *types.Project) []string {
	var missing []string
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeBind {
				if _, err := os.Stat(v.Source); err != nil {
					missing = append(missing, fmt.Sprintf("%s: volume %s", name, v.Source))
				}
			}
		}
		if s.Build != nil {
			if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
				missing = append(missing, fmt.Sprintf("%s: Dockerfile %s in %s", name, s.Build.Dockerfile, s.Build.Context))
			}
		}
	}
	return missing
}

func TestComposeLoads(t *testing.T) {
	p, err := loadCompose(composeDir, readFile(t, filepath.Join(composeDir, "compose.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if m := missingSources(p); len(m) > 0 {
		t.Errorf("the compose file names what does not exist: %v", m)
	}
	names := p.ServiceNames()
	sort.Strings(names)
	want := "chime-1 chime-2 chime-3 grafana kafka-1 kafka-2 kafka-3 prometheus"
	if strings.Join(names, " ") != want {
		t.Fatalf("services %v, want %s", names, want)
	}
	env := func(s types.ServiceConfig, k string) string {
		if v := s.Environment[k]; v != nil {
			return *v
		}
		return ""
	}

	root, _ := filepath.Abs(repoRoot(t))
	var joins []string
	for _, name := range []string{"chime-1", "chime-2", "chime-3"} {
		s := p.Services[name]
		if s.Hostname != name || env(s, "CHIME_NODE_ID") != name || env(s, "CHIME_ADVERTISE_HOST") != name {
			t.Errorf("%s: hostname %q, CHIME_NODE_ID %q, CHIME_ADVERTISE_HOST %q; want the service name for each", name, s.Hostname, env(s, "CHIME_NODE_ID"), env(s, "CHIME_ADVERTISE_HOST"))
		}
		if env(s, "CHIME_INSECURE") != "true" {
			t.Errorf("%s: CHIME_INSECURE %q; chimed refuses 0.0.0.0 without it or TLS, auth and gossip keys", name, env(s, "CHIME_INSECURE"))
		}
		joins = append(joins, env(s, "CHIME_JOIN"))
		if s.Build == nil || s.Build.Context != root || s.Build.Dockerfile != "deploy/docker/Dockerfile" {
			t.Errorf("%s: build %+v, want the repository root with deploy/docker/Dockerfile", name, s.Build)
		}
		if s.HealthCheck == nil || strings.Join(s.HealthCheck.Test, " ") != "CMD /usr/local/bin/chimed health" {
			t.Errorf("%s: healthcheck %+v, want chimed health", name, s.HealthCheck)
		}
		for _, k := range []string{"kafka-1", "kafka-2", "kafka-3"} {
			if d, ok := s.DependsOn[k]; !ok || d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s does not wait for %s to be healthy", name, k)
			}
		}
		if name != "chime-1" {
			if d, ok := s.DependsOn["chime-1"]; !ok || d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s does not wait for chime-1, which creates the cluster, to be healthy", name)
			}
		}
	}
	if joins[0] != "chime-1:7072" || joins[1] != joins[0] || joins[2] != joins[0] {
		t.Errorf("CHIME_JOIN %v, want chime-1:7072 on every node", joins)
	}

	var voters []string
	for i, name := range []string{"kafka-1", "kafka-2", "kafka-3"} {
		s := p.Services[name]
		if !strings.HasPrefix(s.Image, "apache/kafka:3.9.") && !strings.HasPrefix(s.Image, "apache/kafka:4.") {
			t.Errorf("%s: image %q, want the official apache/kafka, 3.9.x or 4.x", name, s.Image)
		}
		for k, v := range map[string]string{
			"KAFKA_NODE_ID":                                  fmt.Sprint(i + 1),
			"KAFKA_PROCESS_ROLES":                            "broker,controller",
			"KAFKA_DEFAULT_REPLICATION_FACTOR":               "3",
			"KAFKA_MIN_INSYNC_REPLICAS":                      "2",
			"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "3",
			"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "3",
			"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "2",
			"KAFKA_ADVERTISED_LISTENERS":                     "PLAINTEXT://" + name + ":9092",
		} {
			if env(s, k) != v {
				t.Errorf("%s: %s=%q, want %q", name, k, env(s, k), v)
			}
		}
		voters = append(voters, fmt.Sprintf("%d@%s:9093", i+1, name))
		if q := env(s, "KAFKA_CONTROLLER_QUORUM_VOTERS"); q != "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093" {
			t.Errorf("%s: KAFKA_CONTROLLER_QUORUM_VOTERS %q", name, q)
		}
		if env(s, "CLUSTER_ID") == "" || env(s, "CLUSTER_ID") != env(p.Services["kafka-1"], "CLUSTER_ID") {
			t.Errorf("%s: CLUSTER_ID %q differs from kafka-1's", name, env(s, "CLUSTER_ID"))
		}
	}
	if got := strings.Join(voters, ","); got != env(p.Services["kafka-1"], "KAFKA_CONTROLLER_QUORUM_VOTERS") {
		t.Errorf("the quorum voters do not match the brokers' node ids: %s", got)
	}
	brokers := "kafka-1:9092,kafka-2:9092,kafka-3:9092"
	if got := env(p.Services["chime-1"], "CHIME_KAFKA_BROKERS"); got != brokers {
		t.Errorf("CHIME_KAFKA_BROKERS %q, want %q", got, brokers)
	}
	for _, name := range []string{"prometheus", "grafana"} {
		img := p.Services[name].Image
		if i := strings.LastIndex(img, ":"); i < 0 || img[i+1:] == "latest" {
			t.Errorf("%s: image %q is not pinned to a version", name, img)
		}
	}

	// Only chime-1's gRPC port and the two UIs are published, on loopback.
	var published []string
	for _, name := range p.ServiceNames() {
		for _, port := range p.Services[name].Ports {
			published = append(published, fmt.Sprintf("%s %s:%s->%d", name, port.HostIP, port.Published, port.Target))
		}
	}
	sort.Strings(published)
	wantPublished := "chime-1 127.0.0.1:7070->7070,grafana 127.0.0.1:3000->3000,prometheus 127.0.0.1:9090->9090"
	if strings.Join(published, ",") != wantPublished {
		t.Errorf("published ports %v, want %s", published, wantPublished)
	}
}

func TestLoadComposeIsStrict(t *testing.T) {
	good := readFile(t, filepath.Join(composeDir, "compose.yaml"))
	for name, bad := range map[string]string{
		"an unknown service field": strings.Replace(string(good), "    hostname: chime-1\n", "    hostname: chime-1\n    hostnme: chime-1\n", 1),
		"a wrong type":             strings.Replace(string(good), "    retries: 5\n", "    retries: five\n", 1),
		"an undeclared volume":     strings.Replace(string(good), "chime-1-data:/var/lib/chime", "chime-9-data:/var/lib/chime", 1),
	} {
		if bad == string(good) {
			t.Fatalf("%s: the planted change did not apply", name)
		}
		if _, err := loadCompose(composeDir, []byte(bad)); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	// A bind mount of a file that is not there loads (docker would create
	// an empty directory in its place); missingSources catches it.
	p, err := loadCompose(composeDir, []byte(strings.Replace(string(good), "../prometheus:/etc/prometheus", "../prometheus-missing:/etc/prometheus", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if m := missingSources(p); len(m) != 1 || !strings.Contains(m[0], "prometheus-missing") {
		t.Errorf("missingSources = %v, want the missing prometheus directory", m)
	}
}

// prometheusConfig is the part of Prometheus's configuration compose's uses;
// decoded strictly, a misspelt key is an error.
type prometheusConfig struct {
	Global struct {
		ScrapeInterval     string `json:"scrape_interval"`
		EvaluationInterval string `json:"evaluation_interval"`
	} `json:"global"`
	RuleFiles     []string `json:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `json:"job_name"`
		StaticConfigs []struct {
			Targets []string `json:"targets"`
		} `json:"static_configs"`
	} `json:"scrape_configs"`
}

// TestComposeMonitoring checks that Prometheus scrapes every Chime node of
// the compose file under the job the alerts select, reads the alerts from
// the directory compose mounts, and that Grafana's provisioning points at
// that Prometheus and at the path where compose mounts the dashboard.
func TestComposeMonitoring(t *testing.T) {
	p, err := loadCompose(composeDir, readFile(t, filepath.Join(composeDir, "compose.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	var cfg prometheusConfig
	if err := yaml.UnmarshalStrict(readFile(t, "prometheus/prometheus.yml"), &cfg); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	if len(cfg.ScrapeConfigs) != 1 || cfg.ScrapeConfigs[0].JobName != "chime" || len(cfg.ScrapeConfigs[0].StaticConfigs) != 1 {
		t.Fatalf("prometheus.yml: want one scrape job \"chime\" (ChimeNodeDown selects it) with static targets: %+v", cfg.ScrapeConfigs)
	}
	targets := cfg.ScrapeConfigs[0].StaticConfigs[0].Targets
	if strings.Join(targets, ",") != "chime-1:7080,chime-2:7080,chime-3:7080" {
		t.Errorf("scrape targets %v, want every chime node's HTTP port", targets)
	}
	mounts := map[string]string{} // service target -> source
	for _, name := range []string{"prometheus", "grafana"} {
		for _, v := range p.Services[name].Volumes {
			if v.Type == types.VolumeTypeBind {
				mounts[name+" "+v.Target] = v.Source
			}
		}
	}
	promDir, _ := filepath.Abs("prometheus")
	if mounts["prometheus /etc/prometheus"] != promDir {
		t.Errorf("compose does not mount deploy/prometheus on /etc/prometheus: %v", mounts)
	}
	if len(cfg.RuleFiles) != 1 || cfg.RuleFiles[0] != "alerts.yml" {
		t.Errorf("rule_files %v, want alerts.yml (beside prometheus.yml)", cfg.RuleFiles)
	}

	var ds struct {
		APIVersion  int `json:"apiVersion"`
		Datasources []struct {
			Name      string `json:"name"`
			Type      string `json:"type"`
			UID       string `json:"uid"`
			Access    string `json:"access"`
			URL       string `json:"url"`
			IsDefault bool   `json:"isDefault"`
			Editable  bool   `json:"editable"`
		} `json:"datasources"`
	}
	if err := yaml.UnmarshalStrict(readFile(t, "grafana/provisioning/datasources/prometheus.yaml"), &ds); err != nil {
		t.Fatalf("datasource provisioning: %v", err)
	}
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" || !ds.Datasources[0].IsDefault {
		t.Errorf("datasource provisioning: want the default prometheus data source at http://prometheus:9090: %+v", ds.Datasources)
	}
	var dp struct {
		APIVersion int `json:"apiVersion"`
		Providers  []struct {
			Name                  string `json:"name"`
			Type                  string `json:"type"`
			DisableDeletion       bool   `json:"disableDeletion"`
			AllowUIUpdates        bool   `json:"allowUiUpdates"`
			UpdateIntervalSeconds int    `json:"updateIntervalSeconds"`
			Options               struct {
				Path                      string `json:"path"`
				FoldersFromFilesStructure bool   `json:"foldersFromFilesStructure"`
			} `json:"options"`
		} `json:"providers"`
	}
	if err := yaml.UnmarshalStrict(readFile(t, "grafana/provisioning/dashboards/chime.yaml"), &dp); err != nil {
		t.Fatalf("dashboard provisioning: %v", err)
	}
	dash, _ := filepath.Abs("grafana/chime.json")
	if len(dp.Providers) != 1 || mounts["grafana "+dp.Providers[0].Options.Path+"/chime.json"] != dash {
		t.Errorf("the dashboard provider's path is not where compose mounts grafana/chime.json: %+v, mounts %v", dp.Providers, mounts)
	}
	prov, _ := filepath.Abs("grafana/provisioning")
	if mounts["grafana /etc/grafana/provisioning"] != prov {
		t.Errorf("compose does not mount grafana/provisioning on /etc/grafana/provisioning: %v", mounts)
	}
}
