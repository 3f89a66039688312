package main

import (
	"cmp"
	"crypto/tls"
	"errors"
	"flag"

	"github.com/chimehq/chime/client"
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
	tokenFile              string
	src                    *certs.Source // loaded on first use
}

// options are the client options the flags ask for: TLS, and the token
// (client.Dial refuses to send it in plaintext beyond this machine).
func (t *tlsFlags) options() ([]client.Option, error) {
	var opts []client.Option
	if t.on() {
		cfg, err := t.config("")
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	switch tok := t.bearer(); {
	case t.tokenFile != "" && t.token != "":
		return nil, errors.New("--token and --token-file: give one")
	case t.tokenFile != "":
		opts = append(opts, client.WithTokenFile(t.tokenFile))
	case tok != "":
		opts = append(opts, client.WithToken(tok))
	}
	return opts, nil
}

// bearer is the token to send: --token, else the environment's.
func (t *tlsFlags) bearer() string { return cmp.Or(t.token, t.envToken) }

// sendsToken reports whether calls carry a token: --token, the
// environment's, or --token-file's.
func (t *tlsFlags) sendsToken() bool { return t.tokenFile != "" || t.bearer() != "" }

func (t *tlsFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&t.enable, "tls", t.enable, "talk to Chime in TLS, verifying the node against the system's CAs (--tls-ca, --tls-cert\nand --tls-key imply it)")
	fs.StringVar(&t.ca, "tls-ca", t.ca, "PEM `file` of the CA that signed the nodes' certificates, to verify the node with")
	fs.StringVar(&t.cert, "tls-cert", t.cert, "PEM `file` of chimectl's client certificate, for nodes that require one (--tls-client-ca)")
	fs.StringVar(&t.key, "tls-key", t.key, "PEM `file` of --tls-cert's private key")
	fs.StringVar(&t.srvName, "tls-server-name", t.srvName, "`name` the node's certificate must carry (default: the host of --addr)")
	fs.StringVar(&t.token, "token", t.token, "bearer `token` for a node started with --auth-file; env "+tokenEnv+" when not given\n(prefer the env or --token-file: a flag shows in ps)")
	fs.StringVar(&t.tokenFile, "token-file", t.tokenFile, "`file` holding the bearer token (white space around it ignored), read again when it changes:\na mounted Kubernetes Secret, a systemd credential")
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
