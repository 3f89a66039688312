// Package certstest makes throwaway certificate authorities and the node and
// client certificates a secured Chime cluster needs, as PEM files, for tests
// and for chime-jepsen --secure. Keys are ECDSA P-256; certificates are valid
// from an hour ago for a day.
package certstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority whose files are in a directory.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
	// File is the CA certificate's PEM file.
	File string
}

// Pair names a certificate's PEM file and its key's.
type Pair struct{ Cert, Key string }

// NewCA creates a CA named name with its files in dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{cert: cert, key: key, dir: dir, File: filepath.Join(dir, name+"-ca.pem")}
	return ca, writePEM(ca.File, "CERTIFICATE", der)
}

// NodeName is certs.NodeName (this package cannot import certs, whose tests
// use it); certs' tests check that Node's certificates pass its CheckNode.
const NodeName = "node.chime"

// Node issues the certificate of node id: it names NodeName,
// id.NodeName, localhost and 127.0.0.1, for both server and client use.
func (ca *CA) Node(id string) (Pair, error) {
	return ca.issue(id, []string{NodeName, id + "." + NodeName, "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
}

// Issue issues a certificate with common name cn, the DNS names dns and the
// extended key usages usage: for tests of certificates Node and Client do
// not make.
func (ca *CA) Issue(cn string, dns []string, usage ...x509.ExtKeyUsage) (Pair, error) {
	return ca.issue(cn, dns, nil, usage)
}

// Client issues a client certificate with common name cn.
func (ca *CA) Client(cn string) (Pair, error) {
	return ca.issue(cn, nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
}

func (ca *CA) issue(cn string, dns []string, ips []net.IP, usage []x509.ExtKeyUsage) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: dns, IPAddresses: ips, ExtKeyUsage: usage, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	base := filepath.Join(ca.dir, fmt.Sprintf("%s-%s", ca.cert.Subject.CommonName, cn))
	p := Pair{Cert: base + ".pem", Key: base + "-key.pem"}
	if err := writePEM(p.Cert, "CERTIFICATE", der); err != nil {
		return Pair{}, err
	}
	return p, writePEM(p.Key, "EC PRIVATE KEY", kder)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

// writePEM writes atomically (a rename), as a rotation should, so that a
// reader never sees half a file.
func writePEM(path, typ string, der []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
