package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// NodeName is the DNS subject alternative name that marks a certificate as a
// node's. Node certificates carry it besides the names clients dial them by.
const NodeName = "node.chime"

// NodeIDName is the DNS subject alternative name that ties a node
// certificate to one node id: "<id>.node.chime". A certificate names exactly
// one, so that the holder of n2's key cannot speak as n3.
func NodeIDName(id string) string { return id + "." + NodeName }

// PeerNodeID is the node id named by the certificate the other end of cs
// presented (NodeIDName), "" when it named none or presented none. It reads
// what the handshake verified; it verifies nothing itself.
func PeerNodeID(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return nodeID(cs.PeerCertificates[0])
}

// nodeID is the node id leaf's DNS names give it (NodeIDName), "" when they
// name none or more than one.
func nodeID(leaf *x509.Certificate) string {
	id := ""
	for _, n := range leaf.DNSNames {
		if rest, ok := strings.CutSuffix(n, "."+NodeName); ok && rest != "" && !strings.Contains(rest, ".") {
			if id != "" && id != rest {
				return ""
			}
			id = rest
		}
	}
	return id
}

// Files names the PEM files, with the flags that gave them, for errors.
type Files struct {
	// Cert and Key are this process's certificate chain and its private key
	// (--tls-cert, --tls-key): a node's serves every port and identifies it
	// to other nodes; a client's (chimectl) is presented to the node.
	Cert, Key string
	// CA is the bundle that signed the nodes' certificates (--tls-ca): a node
	// verifies the nodes it talks to against it, a client the node it dials.
	CA string
	// ClientCA is the bundle that signed clients' certificates
	// (--tls-client-ca); set, the gRPC and HTTP ports require a client
	// certificate signed by it (or a node's).
	ClientCA string
	// Flag names for messages; empty uses tls-cert, tls-key, tls-ca and
	// tls-client-ca.
	CertFlag, KeyFlag, CAFlag, ClientCAFlag string
}

func (f Files) flag(name, def string) string {
	if name == "" {
		name = def
	}
	return "--" + name
}

// material is one consistent load of every file.
type material struct {
	cert     *tls.Certificate // nil without Cert
	ca       *x509.CertPool   // nil without CA
	clientCA *x509.CertPool   // nil without ClientCA
}

type stamp struct {
	size int64
	mod  time.Time
}

// reloadEvery is how often at most a handshake looks at the files.
const reloadEvery = time.Second

// Source holds the current TLS material and builds configurations that read
// it at every handshake.
type Source struct {
	files  Files
	logger *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	mat     material
	stamps  [4]stamp
	checked time.Time
	failed  [4]stamp // the stamps of the last reload that failed, logged once
}

// Load reads files and returns a Source that keeps them current. Cert and
// Key go together. A nil logger discards.
func Load(files Files, logger *slog.Logger) (*Source, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: files, logger: logger, now: time.Now}
	if (files.Cert == "") != (files.Key == "") {
		return nil, fmt.Errorf("%s and %s go together: give both or neither", files.flag(files.CertFlag, "tls-cert"), files.flag(files.KeyFlag, "tls-key"))
	}
	stamps, err := s.stat()
	if err != nil {
		return nil, err
	}
	mat, err := s.load()
	if err != nil {
		return nil, err
	}
	s.mat, s.stamps, s.checked = mat, stamps, s.now()
	return s, nil
}

func (s *Source) paths() [4]string {
	return [4]string{s.files.Cert, s.files.Key, s.files.CA, s.files.ClientCA}
}

func (s *Source) flags() [4]string {
	f := s.files
	return [4]string{f.flag(f.CertFlag, "tls-cert"), f.flag(f.KeyFlag, "tls-key"), f.flag(f.CAFlag, "tls-ca"), f.flag(f.ClientCAFlag, "tls-client-ca")}
}

func (s *Source) stat() (st [4]stamp, err error) {
	for i, p := range s.paths() {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return st, fmt.Errorf("%s %s: %w", s.flags()[i], p, err)
		}
		st[i] = stamp{size: fi.Size(), mod: fi.ModTime()}
	}
	return st, nil
}

func (s *Source) load() (material, error) {
	var m material
	p, fl := s.paths(), s.flags()
	if p[0] != "" {
		cert, err := tls.LoadX509KeyPair(p[0], p[1])
		if err != nil {
			return m, fmt.Errorf("%s %s with %s %s: %w", fl[0], p[0], fl[1], p[1], err)
		}
		m.cert = &cert
	}
	for i, pool := range []**x509.CertPool{&m.ca, &m.clientCA} {
		path := p[2+i]
		if path == "" {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return m, fmt.Errorf("%s %s: %w", fl[2+i], path, err)
		}
		*pool = x509.NewCertPool()
		if !(*pool).AppendCertsFromPEM(b) {
			return m, fmt.Errorf("%s %s: no PEM certificate in it", fl[2+i], path)
		}
	}
	return m, nil
}

// current returns the material to use now, reloading it if a file changed.
func (s *Source) current() material {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Sub(s.checked) < reloadEvery {
		return s.mat
	}
	s.checked = now
	st, err := s.stat()
	if err == nil && st == s.stamps {
		return s.mat
	}
	if err == nil {
		var m material
		if m, err = s.load(); err == nil {
			s.mat, s.stamps, s.failed = m, st, [4]stamp{}
			s.logger.Info("TLS files reloaded", "cert", s.files.Cert, "ca", s.files.CA, "client_ca", s.files.ClientCA)
			return s.mat
		}
	}
	if st != s.failed {
		s.failed = st
		s.logger.Error("TLS files changed but do not load; keeping the ones in use", "err", err)
	}
	return s.mat
}

// CheckNode verifies that the node's own certificate is one the other nodes
// accept as node id: signed by the node CA, naming NodeName and
// NodeIDName(id) (and no other node id), usable for both ends of a
// connection.
func (s *Source) CheckNode(id string) error {
	m := s.current()
	fl := s.flags()
	if m.cert == nil {
		return fmt.Errorf("%s and %s are required with TLS on", fl[0], fl[1])
	}
	if m.ca == nil {
		return fmt.Errorf("%s is required with TLS on: nodes verify each other against it", fl[2])
	}
	leaf, err := x509.ParseCertificate(m.cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("%s %s: %w", fl[0], s.files.Cert, err)
	}
	if _, err := verifyNode(leaf, intermediates(m.cert.Certificate[1:]), m.ca, x509.ExtKeyUsageServerAuth); err != nil {
		return fmt.Errorf("%s %s is not a node certificate other nodes accept: %w", fl[0], s.files.Cert, err)
	}
	if _, err := verifyNode(leaf, intermediates(m.cert.Certificate[1:]), m.ca, x509.ExtKeyUsageClientAuth); err != nil {
		return fmt.Errorf("%s %s cannot be presented as a client certificate to other nodes: %w", fl[0], s.files.Cert, err)
	}
	if got := nodeID(leaf); got != id {
		named := "names no node id"
		if got != "" {
			named = fmt.Sprintf("is node %q's", got)
		}
		return fmt.Errorf("%s %s %s: the certificate of node %q must name %q (and no other <id>.%s) as a DNS name, so that the other nodes know which node holds it",
			fl[0], s.files.Cert, named, id, NodeIDName(id), NodeName)
	}
	return nil
}

func intermediates(ders [][]byte) *x509.CertPool {
	if len(ders) == 0 {
		return nil
	}
	p := x509.NewCertPool()
	for _, d := range ders {
		if c, err := x509.ParseCertificate(d); err == nil {
			p.AddCert(c)
		}
	}
	return p
}

// verifyNode verifies that leaf chains to ca and names NodeName.
func verifyNode(leaf *x509.Certificate, inter, ca *x509.CertPool, usage x509.ExtKeyUsage) ([][]*x509.Certificate, error) {
	if ca == nil {
		return nil, errors.New("no node CA (--tls-ca) to verify it against")
	}
	return leaf.Verify(x509.VerifyOptions{Roots: ca, Intermediates: inter, DNSName: NodeName, KeyUsages: []x509.ExtKeyUsage{usage}})
}

// classify verifies the certificates the other end presented (none is
// allowed: the caller is then known only by what it sends, a token) and says
// whose they are.
func (m material) classify(certs []*x509.Certificate, usage x509.ExtKeyUsage) (Identity, error) {
	if len(certs) == 0 {
		return Identity{}, nil
	}
	leaf, inter := certs[0], x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := verifyNode(leaf, inter, m.ca, usage); err == nil {
		return Identity{Node: true, NodeID: nodeID(leaf), Name: leaf.Subject.CommonName}, nil
	}
	if m.clientCA == nil {
		return Identity{}, errors.New("the certificate is not a node's, and no client CA (--tls-client-ca) is configured")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: m.clientCA, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return Identity{}, fmt.Errorf("client certificate %q: %w", leaf.Subject.CommonName, err)
	}
	return Identity{Name: leaf.Subject.CommonName, Cert: true}, nil
}

// Identify verifies the certificates a client presented (on the HTTP port,
// where no AuthInfo carries them) and says whose they are.
func (s *Source) Identify(chain []*x509.Certificate) (Identity, error) {
	return s.current().classify(chain, x509.ExtKeyUsageClientAuth)
}

// Identity is what a verified certificate says about the other end.
type Identity struct {
	// Node: the certificate is a node's (chains to the node CA, names NodeName).
	Node bool
	// NodeID is the node id a node's certificate names (NodeIDName); ""
	// for a client, or a node certificate that names none.
	NodeID string
	// Cert: a client certificate, signed by the client CA.
	Cert bool
	// Name is the certificate's subject common name ("" without one).
	Name string
}

func (s *Source) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if m := s.current(); m.cert != nil {
		return m.cert, nil
	}
	return nil, errors.New("no certificate configured")
}

// ServerConfig is for the gRPC and HTTP ports: the node's certificate; a
// client certificate required if a client CA is set, and verified if given
// either way (a node's, or one signed by the client CA).
func (s *Source) ServerConfig() *tls.Config {
	auth := tls.RequestClientCert
	if s.files.ClientCA != "" {
		auth = tls.RequireAnyClientCert
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.getCertificate,
		ClientAuth:     auth,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := s.current().classify(cs.PeerCertificates, x509.ExtKeyUsageClientAuth)
			return err
		},
	}
}

// PeerServerConfig is for the Raft port: nodes only, always mutual.
func (s *Source) PeerServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.getCertificate,
		ClientAuth:     tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return s.current().verifyNodeState(cs, x509.ExtKeyUsageClientAuth)
		},
	}
}

func (m material) verifyNodeState(cs tls.ConnectionState, usage x509.ExtKeyUsage) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no certificate: only nodes may connect")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := verifyNode(cs.PeerCertificates[0], inter, m.ca, usage); err != nil {
		return fmt.Errorf("%q is not a node of this cluster: %w", cs.PeerCertificates[0].Subject.CommonName, err)
	}
	return nil
}

// PeerClientConfig is for a node dialling another node (Raft, forwarding, the
// Peer service): it presents the node's certificate and accepts only a node's,
// whatever address it dialled.
func (s *Source) PeerClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if m := s.current(); m.cert != nil {
				return m.cert, nil
			}
			return &tls.Certificate{}, nil
		},
		// Verified below against the pool of the moment, by NodeName rather
		// than the dialled host.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return s.current().verifyNodeState(cs, x509.ExtKeyUsageServerAuth)
		},
	}
}

// ClientConfig is for a client (chimectl) dialling a node: the client
// certificate if one is set, and the server verified against the CA (the
// system roots without one) for serverName, or, if it is empty, for the host
// the client dials (which gRPC and net/http put in the config's ServerName).
func (s *Source) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if m := s.current(); m.cert != nil {
				return m.cert, nil
			}
			return &tls.Certificate{}, nil
		},
		// Verified below against the pool of the moment.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			name := serverName
			if name == "" {
				name = cs.ServerName
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: s.current().ca, Intermediates: inter, DNSName: name})
			return err
		},
	}
}

// AuthInfo is the gRPC AuthInfo of a connection accepted with
// ServerCredentials: TLS's, and the caller's identity.
type AuthInfo struct {
	credentials.TLSInfo
	Identity Identity
}

// ServerCredentials are gRPC transport credentials for the gRPC port
// (ServerConfig), whose AuthInfo carries the caller's Identity.
func (s *Source) ServerCredentials() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: credentials.NewTLS(s.ServerConfig()), src: s}
}

type serverCreds struct {
	credentials.TransportCredentials
	src *Source
}

func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	info, ok := ai.(credentials.TLSInfo)
	if !ok {
		_ = conn.Close() // the connection is refused; the error below says why
		return nil, nil, fmt.Errorf("certs: unexpected auth info %T", ai)
	}
	id, err := c.src.current().classify(info.State.PeerCertificates, x509.ExtKeyUsageClientAuth)
	if err != nil {
		_ = conn.Close() // the connection is refused; err says why
		return nil, nil, err
	}
	return conn, AuthInfo{TLSInfo: info, Identity: id}, nil
}

func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: c.TransportCredentials.Clone(), src: c.src}
}

// PeerCredentials are gRPC transport credentials for a node's calls to
// other nodes (PeerClientConfig).
func (s *Source) PeerCredentials() credentials.TransportCredentials {
	return credentials.NewTLS(s.PeerClientConfig())
}

// PeerCredentialsFor is PeerCredentials for calls to node id alone: the
// handshake also fails unless the certificate at the other end names id
// (NodeIDName), so a connection dialled for one node never reaches another.
func (s *Source) PeerCredentialsFor(id string) credentials.TransportCredentials {
	cfg := s.PeerClientConfig()
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := verify(cs); err != nil {
			return err
		}
		if got := PeerNodeID(cs); got != id {
			return fmt.Errorf("dialled node %q, but the certificate there is node %q's", id, got)
		}
		return nil
	}
	return credentials.NewTLS(cfg)
}
