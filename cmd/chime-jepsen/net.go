package main

import (
	"fmt"
	"os/exec"
	"strings"
)

// The test network: a Linux bridge on the host, and one network namespace per
// node joined to it by a veth pair. Every address lives only inside this
// setup (10.77.0.0/24): the host side of the bridge is 10.77.0.1 (the Kafka
// broker and the clients), node i is 10.77.0.(10+i). Faults are iptables
// rules in a chain of our own inside each namespace, and qdiscs on the
// namespace's interface, so healing is flushing them.

const (
	bridge     = "chjbr0"
	hostIP     = "10.77.0.1"
	subnetBits = "24"
	faultChain = "CHJ"
)

func nsName(i int) string { return fmt.Sprintf("chj-n%d", i) }
func nodeIP(i int) string { return fmt.Sprintf("10.77.0.%d", 10+i) }

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// inNS runs a command inside node i's namespace.
func inNS(i int, args ...string) error {
	return sh(append([]string{"ip", "netns", "exec", nsName(i)}, args...)...)
}

// setupNetwork creates the bridge and n namespaces. It removes leftovers of
// an earlier run that did not clean up first.
func setupNetwork(n int) error {
	teardownNetwork(n)
	steps := [][]string{
		{"ip", "link", "add", bridge, "type", "bridge"},
		{"ip", "addr", "add", hostIP + "/" + subnetBits, "dev", bridge},
		{"ip", "link", "set", bridge, "up"},
	}
	for i := 1; i <= n; i++ {
		host := fmt.Sprintf("chjv%d", i)
		steps = append(steps,
			[]string{"ip", "netns", "add", nsName(i)},
			[]string{"ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", nsName(i)},
			[]string{"ip", "link", "set", host, "master", bridge, "up"},
			[]string{"ip", "-n", nsName(i), "addr", "add", nodeIP(i) + "/" + subnetBits, "dev", "eth0"},
			[]string{"ip", "-n", nsName(i), "link", "set", "eth0", "up"},
			[]string{"ip", "-n", nsName(i), "link", "set", "lo", "up"},
		)
	}
	for _, s := range steps {
		if err := sh(s...); err != nil {
			return err
		}
	}
	for i := 1; i <= n; i++ {
		for _, hook := range []string{"INPUT", "OUTPUT"} {
			chain := faultChain + "-" + hook
			if err := inNS(i, "iptables", "-N", chain); err != nil {
				return err
			}
			if err := inNS(i, "iptables", "-A", hook, "-j", chain); err != nil {
				return err
			}
		}
	}
	return nil
}

// teardownNetwork removes everything setupNetwork made; errors are ignored
// because parts may not exist. A namespace outlives its name while a
// process (a node not yet dead) is in it, and keeps its veth pair; so the
// pair is deleted by its host end too.
func teardownNetwork(n int) {
	for i := 1; i <= max(n, 9); i++ {
		_ = exec.Command("ip", "netns", "del", nsName(i)).Run()               // fails for a namespace never made
		_ = exec.Command("ip", "link", "del", fmt.Sprintf("chjv%d", i)).Run() // fails once the namespace took it
	}
	_ = exec.Command("ip", "link", "del", bridge).Run() // fails for a bridge never made
}

// heal removes every fault rule and qdisc in node i's namespace.
func heal(i int) error {
	var errs []string
	for _, hook := range []string{"INPUT", "OUTPUT"} {
		if err := inNS(i, "iptables", "-F", faultChain+"-"+hook); err != nil {
			errs = append(errs, err.Error())
		}
	}
	// Fails when no qdisc was added (the node was never slowed): nothing to heal.
	_ = exec.Command("ip", "netns", "exec", nsName(i), "tc", "qdisc", "del", "dev", "eth0", "root").Run()
	if len(errs) > 0 {
		return fmt.Errorf("heal %s: %s", nsName(i), strings.Join(errs, "; "))
	}
	return nil
}

// cut drops all traffic, TCP and UDP, between node i and the given peer
// addresses, in both directions.
func cut(i int, peers ...string) error {
	for _, p := range peers {
		if err := inNS(i, "iptables", "-A", faultChain+"-INPUT", "-s", p, "-j", "DROP"); err != nil {
			return err
		}
		if err := inNS(i, "iptables", "-A", faultChain+"-OUTPUT", "-d", p, "-j", "DROP"); err != nil {
			return err
		}
	}
	return nil
}

// cutKafka drops node i's traffic to the broker only.
func cutKafka(i int, port string) error {
	return inNS(i, "iptables", "-A", faultChain+"-OUTPUT", "-d", hostIP, "-p", "tcp", "--dport", port, "-j", "DROP")
}

// lose drops a random fraction of node i's packets to and from the other
// nodes. (tc netem, the usual tool for loss, delay and reordering, is not in
// this kernel; iptables' statistic match gives loss, and slow below gives
// delay.)
func lose(i int, prob float64, peers ...string) error {
	p := fmt.Sprintf("%.2f", prob)
	for _, peer := range peers {
		if err := inNS(i, "iptables", "-A", faultChain+"-INPUT", "-s", peer, "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"); err != nil {
			return err
		}
		if err := inNS(i, "iptables", "-A", faultChain+"-OUTPUT", "-d", peer, "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"); err != nil {
			return err
		}
	}
	return nil
}

// slow throttles node i's outgoing traffic with a token bucket: packets
// queue, which delays them by up to latency, and beyond that are dropped.
func slow(i int) error {
	return inNS(i, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2mbit", "burst", "32kbit", "latency", "200ms")
}
