package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

// security is what --secure runs the cluster with: a node CA and a client
// CA made for the run, TLS on every port with client certificates required,
// an auth file in which the driver's certificate is an admin (the
// nemesis, backups, status), the workload's bearer token a scheduler of
// every topic (so its invalid operations still meet the input rules, not
// the role's), and tenant A's a scheduler of its own topics and ids only
// (tenants.go), and a gossip key.
type security struct {
	dir              string
	nodeCA, clientCA *certstest.CA
	authFile         string
	gossipKeys       string
	driver           *certs.Source
	token            string
	tenantToken      string
}

// newSecurity makes the run's PKI and auth file in out/pki. The auth file
// names the workload's credential for ingestTopic's records, unless it is "".
func newSecurity(out, ingestTopic string) (*security, error) {
	s := &security{dir: filepath.Join(out, "pki")}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	var err error
	if s.nodeCA, err = certstest.NewCA(s.dir, "nodes"); err != nil {
		return nil, err
	}
	if s.clientCA, err = certstest.NewCA(s.dir, "clients"); err != nil {
		return nil, err
	}
	driver, err := s.clientCA.Client("chime-jepsen")
	if err != nil {
		return nil, err
	}
	if s.driver, err = certs.Load(certs.Files{Cert: driver.Cert, Key: driver.Key, CA: s.nodeCA.File}, nil); err != nil {
		return nil, err
	}
	var key [32]byte
	rand.Read(key[:])
	s.gossipKeys = filepath.Join(s.dir, "gossip.keys")
	if err := os.WriteFile(s.gossipKeys, []byte(base64.StdEncoding.EncodeToString(key[:])+"\n"), 0o600); err != nil {
		return nil, err
	}
	s.token, s.tenantToken = newToken(), newToken()
	s.authFile = filepath.Join(s.dir, "auth.json")
	// The ingest topic's records act for the workload's credential: a
	// scheduler of every topic and id, as the workload's calls are.
	ingest := ""
	if ingestTopic != "" {
		ingest = fmt.Sprintf(",\n  \"ingest\": {%q: \"workload\"}", ingestTopic)
	}
	return s, os.WriteFile(s.authFile, fmt.Appendf(nil, `{
  "tokens": [
    {"name": "workload", "sha256": %q, "role": "scheduler", "topics": ["*"]},
    {"name": %q, "sha256": %q, "role": "scheduler", "topics": [%q], "id_prefixes": [%q]}
  ],
  "certificates": [{"name": "driver", "common_name": "chime-jepsen", "role": "admin"}]%s
}
`, tokenSum(s.token), tenantName, tokenSum(s.tenantToken), tenantTopicGrant, tenantIDPrefix, ingest), 0o600)
}

func newToken() string {
	var tok [32]byte
	rand.Read(tok[:])
	return hex.EncodeToString(tok[:])
}

func tokenSum(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// flags are a node's security flags, its certificate made on first use.
func (s *security) flags(n *node) ([]string, error) {
	pair, err := s.nodeCA.Node(n.id)
	if err != nil {
		return nil, err
	}
	return []string{"--tls-cert", pair.Cert, "--tls-key", pair.Key, "--tls-ca", s.nodeCA.File, "--tls-client-ca", s.clientCA.File,
		"--auth-file", s.authFile, "--audit-log", filepath.Join(filepath.Dir(n.logPath), n.id+"-audit.log"), "--gossip-key-file", s.gossipKeys}, nil
}

// clientOptions are the driver's (admin) client options, with token as
// the bearer token unless empty (the workload's or tenant A's). Nodes are
// verified by the name every node certificate carries, whatever IP the
// driver dials.
func (s *security) clientOptions(token string) []client.Option {
	opts := []client.Option{client.WithTLS(s.driver.ClientConfig(certs.NodeName))}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	return opts
}

// httpClient calls a node's HTTP port as the driver. Each client is made
// for one call, so it keeps no connection open after it: an idle one of a
// Transport nobody closes would stay, with its goroutines, to the end.
func (s *security) httpClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: s.driver.ClientConfig(certs.NodeName), DisableKeepAlives: true}}
}
