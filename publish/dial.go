package publish

import (
	"context"
	"net"
	"time"
)

// dialer returns the Kafka connections' dial function. On Linux every
// connection carries TCP_USER_TIMEOUT set to unacked: the kernel drops a
// connection whose sent bytes go unacknowledged by the broker's TCP stack
// for that long. A broker that is merely slow still acknowledges the bytes
// of a request at once, so only a dead path trips it.
//
// Without it, a produce sent into a network that silently drops packets
// (a firewall, a broker host gone) waits out WriteTimeout, and its events
// wait with it, because the shard cannot fire again what a Publish call
// still holds. In 100 s Kafka-cut fault runs those events reached Kafka
// 2.5-2.8 s after the heal, exactly WriteTimeout after they were sent,
// delivered by a TCP retransmission of the old request, while everything
// else was back within 1 s.
//
// The function dials TCP only: kafka-go's Transport then wraps the
// connection in TLS and authenticates it with SASL (Config.Security), so
// the timeout holds beneath both.
func dialer(unacked time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Control: userTimeout(unacked)}
	return d.DialContext
}
