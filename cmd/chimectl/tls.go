package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/chimehq/chime/rpc/certs"
)

// tokenEnv holds the bearer token when --token is not given.
const tokenEnv = "CHIME_TOKEN"

// tlsFlags are the global flags that say how chimectl proves who it is and
// protects its calls: TLS (a node started with --tls-cert serves every
// port in TLS) and a bearer token (a node started with --auth-file).
type tlsFlags struct {
	enable                 bool
	ca, cert, key, srvName string
	token, envToken        string
	src                    *certs.Source // loaded on first use
}

// bearer is a bearer token sent with every call.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false so that a token works with chimed dev
// on loopback; dialOptions refuses a token in plaintext to any other
// address.
func (bearer) RequireTransportSecurity() bool { return false }

// dialOptions are the credentials of a gRPC connection to Chime at addr. A
// token is sent in plaintext only to a loopback address: anyone on the
// path to another could read it and act as its holder.
func (t *tlsFlags) dialOptions(addr string) ([]grpc.DialOption, error) {
	creds, err := t.credentials()
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if tok := cmp.Or(t.token, t.envToken); tok != "" {
		if !t.on() && !loopback(addr) {
			return nil, fmt.Errorf("refusing to send the bearer token (--token or %s) in plaintext to %s, beyond this machine: add --tls, or --tls-ca for a node whose CA the system does not trust", tokenEnv, addr)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	return opts, nil
}

// loopback reports whether addr (host:port) names this machine: a loopback
// IP or "localhost".
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

func (t *tlsFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&t.enable, "tls", t.enable, "talk to Chime in TLS, verifying the node against the system's CAs (--tls-ca, --tls-cert\nand --tls-key imply it)")
	fs.StringVar(&t.ca, "tls-ca", t.ca, "PEM `file` of the CA that signed the nodes' certificates, to verify the node with")
	fs.StringVar(&t.cert, "tls-cert", t.cert, "PEM `file` of chimectl's client certificate, for nodes that require one (--tls-client-ca)")
	fs.StringVar(&t.key, "tls-key", t.key, "PEM `file` of --tls-cert's private key")
	fs.StringVar(&t.srvName, "tls-server-name", t.srvName, "`name` the node's certificate must carry (default: the host of --addr)")
	fs.StringVar(&t.token, "token", t.token, "bearer `token` for a node started with --auth-file; env "+tokenEnv+" when not given\n(prefer the env: a flag shows in ps)")
}

func (t *tlsFlags) on() bool {
	return t.enable || t.ca != "" || t.cert != "" || t.key != "" || t.srvName != ""
}

// config returns the TLS client configuration the flags describe.
func (t *tlsFlags) config(serverName string) (*tls.Config, error) {
	if t.src == nil {
		src, err := certs.Load(certs.Files{Cert: t.cert, Key: t.key, CA: t.ca}, nil)
		if err != nil {
			return nil, err
		}
		t.src = src
	}
	if t.srvName != "" {
		serverName = t.srvName
	}
	return t.src.ClientConfig(serverName), nil
}

// credentials are the gRPC transport credentials of a call to Chime:
// plaintext without the TLS flags.
func (t *tlsFlags) credentials() (credentials.TransportCredentials, error) {
	if !t.on() {
		return insecure.NewCredentials(), nil
	}
	cfg, err := t.config("")
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}
