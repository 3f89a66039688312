package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/chimehq/chime/rpc/certs"
)

const healthAbout = `Usage: chimed health [flags]

Asks the chimed running on this machine whether it is alive (GET /healthz) or,
with --ready, whether every shard it holds has a leader (GET /readyz) and, with
--voter, whether it is a voter of every shard the placement gives it, and exits
0 if it answers 200, 1 otherwise, printing the answer. It is for container
health checks on an image without curl: it reads the node's own CHIME_*
variables, so it finds the port of CHIME_HTTP_ADDR, on loopback when the node
listens on every interface, and speaks TLS with the node's certificate when
CHIME_TLS_CERT is set.

Flags:
`

// runHealth is chimed health: one HTTP GET of the node's health endpoint.
func runHealth(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chimed health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	httpAddr := fs.String("http-addr", "127.0.0.1:7080", "the node's --http-addr; a host of 0.0.0.0, :: or none is asked on loopback")
	ready := fs.Bool("ready", false, "ask /readyz (every shard has a leader) instead of /healthz (the process serves)")
	voter := fs.Bool("voter", false, "ask /readyz?voter=1: --ready, and the node is a voter of every shard the placement gives it\n(what a rolling restart waits for before stopping the next node)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	tlsCert := fs.String("tls-cert", "", "the node's --tls-cert: the port is HTTPS, and this certificate is presented")
	tlsKey := fs.String("tls-key", "", "the node's --tls-key")
	tlsCA := fs.String("tls-ca", "", "the node's --tls-ca, to verify the node with")
	fs.Usage = func() {
		fmt.Fprint(stderr, healthAbout)
		fs.PrintDefaults()
		fmt.Fprint(stderr, envHelp())
		fmt.Fprint(stderr, "\nExamples:\n  chimed health\n  chimed health --ready --http-addr 127.0.0.1:7180\n  HEALTHCHECK CMD [\"/usr/local/bin/chimed\", \"health\"]   (a Dockerfile)\n")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	// A node's environment sets every CHIME_ variable of chimed serve;
	// those health has no flag for are not mistakes here.
	if _, err := setFromEnv(fs, nil, os.Environ()); err != nil {
		fmt.Fprintf(stderr, "chimed health: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chimed health: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	host, port, err := net.SplitHostPort(*httpAddr)
	if err != nil {
		fmt.Fprintf(stderr, "chimed health: --http-addr %q: %v\n", *httpAddr, err)
		return 2
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	client := &http.Client{Timeout: *timeout}
	scheme := "http"
	if *tlsCert != "" {
		src, err := certs.Load(certs.Files{Cert: *tlsCert, Key: *tlsKey, CA: *tlsCA}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			fmt.Fprintf(stderr, "chimed health: %v\n", err)
			return 2
		}
		// The node's certificate names node.chime, whatever address it is
		// asked at; presenting it passes a --tls-client-ca too.
		client.Transport = &http.Transport{TLSClientConfig: src.PeerClientConfig()}
		scheme = "https"
	}
	path := "/healthz"
	switch {
	case *voter:
		path = "/readyz?voter=1"
	case *ready:
		path = "/readyz"
	}
	url := scheme + "://" + net.JoinHostPort(host, port) + path
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "chimed health: %v\n", err)
		return 2
	}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "chimed health: %s: %v\n", url, err)
		return 1
	}
	defer func() { _ = resp.Body.Close() }() // read to the limit below; nothing to lose
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	answer := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "chimed health: %s: %s: %s\n", url, resp.Status, answer)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %s\n", url, answer)
	return 0
}
