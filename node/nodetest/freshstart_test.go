package nodetest

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is an io.Writer the nodes' log handler shares across their
// goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startLinesAllowed are raft's lines a fresh start may still log at WARN or
// ERROR: the old leader's replication to the new leader meeting its new
// term, on a balancing leadership transfer, which raft logs at ERROR and the
// shard's raft logger cannot tell by its arguments from the same line after
// a partition heals; and a vote refused to a candidate whose log is behind,
// which raft logs at WARN whenever two replicas' elections cross (a loaded
// machine's slow start: seen once in CI).
var startLinesAllowed = []string{
	`msg="peer has newer term, stopping replication"`,
	`msg="rejecting vote request since our last term is greater"`,
}

// A fresh cluster starts without WARN or ERROR lines beyond
// startLinesAllowed. Regression: each shard's leader added a node's replica
// as soon as the node joined the gossip, before the node's host had opened
// it, and raft logged an ERROR ("failed to appendEntries to", "failed to
// heartbeat to") for every send to it until it had, about a hundred on
// every start of a 3-node cluster.
func TestFreshStartLogsNoErrors(t *testing.T) {
	var log lockedBuffer
	logger := slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := New(t, Options{Shards: 8, Logger: logger})
	for _, id := range []string{"n1", "n2", "n3"} {
		c.Add(id)
	}
	// Settled: every replica added and promoted, and every balancing
	// transfer made, so the whole start is in the log.
	c.WaitSettled(60 * time.Second)
	var bad []string
	for line := range strings.Lines(log.String()) {
		allowed := false
		for _, a := range startLinesAllowed {
			allowed = allowed || strings.Contains(line, a)
		}
		if !allowed {
			bad = append(bad, line)
		}
	}
	if len(bad) > 0 {
		t.Errorf("a fresh start logged %d WARN or ERROR lines:\n%s", len(bad), strings.Join(bad, ""))
	}
}
