package node

import (
	"fmt"
	"net"
	"slices"
	"strings"
)

// advertised is the address the node gives the others for a listener bound
// at addr: cfg.AdvertiseHost with the listener's port, or, without it, the
// listener's own address. A node in a cluster that listens on every
// interface (0.0.0.0 or ::) without AdvertiseHost is refused: the others
// would be told to dial "[::]:7071", which reaches only themselves.
func advertised(cfg Config, flag, given string, addr net.Addr) (string, error) {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	if cfg.AdvertiseHost != "" {
		return net.JoinHostPort(cfg.AdvertiseHost, port), nil
	}
	if ip := net.ParseIP(host); cfg.Cluster && ip != nil && ip.IsUnspecified() {
		return "", fmt.Errorf("--%s %s listens on every interface, and the other nodes cannot dial that: give --advertise-host the host name or IP they reach this node by", flag, given)
	}
	return addr.String(), nil
}

// gossipAdvertise is the gossip address memberlist tells the others: the
// advertise host with the gossip port when that host is an IP. memberlist
// advertises only IPs; for a host name it is left to pick this machine's
// private IP, as it does for a bind on every interface, and the name stays
// in the Raft and gRPC addresses, which are dialled by name.
func gossipAdvertise(gossipAddr, advertiseHost string) string {
	if net.ParseIP(advertiseHost) == nil {
		return ""
	}
	_, port, err := net.SplitHostPort(gossipAddr)
	if err != nil {
		return ""
	}
	return net.JoinHostPort(advertiseHost, port)
}

// withoutSelf drops the entries of join that name this node's own gossip
// address: its port with the advertise host, or with a host that resolves
// to an address of this machine. A node cannot join itself, and dropping
// the entry lets every node of a cluster (every pod of a StatefulSet, say)
// be given the same list: the node it names creates the cluster when its
// data directory is new, and restarts from its stored peers when it is not.
func withoutSelf(join []string, gossipAddr, advertiseHost string) []string {
	_, port, err := net.SplitHostPort(gossipAddr)
	if err != nil || len(join) == 0 {
		return join
	}
	var local []net.IP
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if in, ok := a.(*net.IPNet); ok {
				local = append(local, in.IP)
			}
		}
	}
	self := func(entry string) bool {
		host, p, err := net.SplitHostPort(entry)
		if err != nil || p != port {
			return false
		}
		if advertiseHost != "" && strings.EqualFold(host, advertiseHost) {
			return true
		}
		ips, err := net.LookupIP(host)
		if err != nil {
			return false
		}
		return slices.ContainsFunc(ips, func(ip net.IP) bool {
			return slices.ContainsFunc(local, ip.Equal)
		})
	}
	return slices.DeleteFunc(slices.Clone(join), self)
}
