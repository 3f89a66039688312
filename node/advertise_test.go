package node

import (
	"net"
	"slices"
	"strings"
	"testing"
)

// TestWithoutSelf: an entry is this node when its port is the gossip port
// and its host is the advertise host or resolves to an address of this
// machine; everything else is kept, in order.
func TestWithoutSelf(t *testing.T) {
	join := []string{"chime-0.chime-headless:7072", "localhost:7072", "127.0.0.1:7072", "localhost:7073",
		"192.0.2.1:7072", "no-such-host.invalid:7072", "CHIME-0.chime-headless:7072"}
	got := withoutSelf(join, "0.0.0.0:7072", "chime-0.chime-headless")
	want := []string{"localhost:7073", "192.0.2.1:7072", "no-such-host.invalid:7072"}
	if !slices.Equal(got, want) {
		t.Errorf("withoutSelf = %q, want %q", got, want)
	}
	if got := withoutSelf(join[:1], "0.0.0.0:7072", "chime-1.chime-headless"); !slices.Equal(got, join[:1]) {
		t.Errorf("another node's name was dropped: %q", got)
	}
	if join[0] != "chime-0.chime-headless:7072" {
		t.Error("withoutSelf changed its argument")
	}
}

// TestAdvertised: the advertise host takes the listener's port; without
// it a cluster node on every interface is refused, naming the flag and
// the way out, and a single node is not.
func TestAdvertised(t *testing.T) {
	every := &net.TCPAddr{IP: net.IPv4zero, Port: 7071}
	if got, err := advertised(Config{Cluster: true, AdvertiseHost: "chime-0.x"}, "raft-addr", "0.0.0.0:7071", every); err != nil || got != "chime-0.x:7071" {
		t.Errorf("with a host: %q, %v", got, err)
	}
	if _, err := advertised(Config{Cluster: true}, "raft-addr", ":7071", every); err == nil || !strings.Contains(err.Error(), "--raft-addr :7071 listens on every interface") || !strings.Contains(err.Error(), "--advertise-host") {
		t.Errorf("every interface, no host: %v", err)
	}
	if got, err := advertised(Config{}, "grpc-addr", "0.0.0.0:7070", every); err != nil || got != "0.0.0.0:7071" {
		t.Errorf("a single node: %q, %v", got, err)
	}
	lo := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070}
	if got, err := advertised(Config{Cluster: true}, "grpc-addr", "127.0.0.1:7070", lo); err != nil || got != "127.0.0.1:7070" {
		t.Errorf("a specific address: %q, %v", got, err)
	}
	if got := gossipAdvertise("0.0.0.0:7072", "10.1.2.3"); got != "10.1.2.3:7072" {
		t.Errorf("gossip with an IP host: %q", got)
	}
	if got := gossipAdvertise("0.0.0.0:7072", "chime-0.x"); got != "" {
		t.Errorf("gossip with a name: %q, want memberlist's own choice", got)
	}
}
