package node

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chimehq/chime/membership"
)

// gossipKeyPoll is how often the gossip key file is looked at. A rotation
// step is applied on every node before the next, so a step takes about this
// long plus the operator's check; a stat per second costs nothing.
const gossipKeyPoll = time.Second

// fileStamp is what tells that a file changed without reading it.
type fileStamp struct {
	size int64
	mod  time.Time
}

func statStamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{size: fi.Size(), mod: fi.ModTime()}, nil
}

// readKeyFile reads and parses the gossip key file (membership.ParseKeyFile)
// and returns the stamp it had. A file that changed while it was read (a
// writer still at it) is an error: what was read may be half of it.
func readKeyFile(path string) ([][]byte, fileStamp, error) {
	before, err := statStamp(path)
	if err != nil {
		return nil, before, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, before, err
	}
	if after, err := statStamp(path); err != nil || after != before {
		return nil, before, fmt.Errorf("%s changed while being read; it is read again at its next change", path)
	}
	keys, err := membership.ParseKeyFile(data)
	if err != nil {
		return nil, before, fmt.Errorf("%s: %w", path, err)
	}
	return keys, before, nil
}

// keyWatcher applies the gossip key file to the membership whenever the
// file changes. It owns one goroutine, from start to Close.
type keyWatcher struct {
	path   string
	ml     *membership.Membership
	log    *slog.Logger
	errors prometheus.Counter

	// Owned by run.
	applied fileStamp // the stamp of the file whose keys are in use
	failed  string    // the stamp and error of the last failure, logged once

	stop, done chan struct{}
}

func newKeyWatcher(path string, loaded fileStamp, ml *membership.Membership, log *slog.Logger) *keyWatcher {
	return &keyWatcher{
		path: path, ml: ml, log: log, applied: loaded,
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_gossip_key_file_errors_total",
			Help: "Changes of the gossip key file that could not be applied (unreadable, or not a valid key list); the keys in use were kept.",
		}),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
}

func (w *keyWatcher) start() { go w.run() }

func (w *keyWatcher) run() {
	defer close(w.done)
	t := time.NewTicker(gossipKeyPoll)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		w.check()
	}
}

// check applies the file if it changed since the keys in use were read. A
// file that does not load (missing, half written, a bad line) leaves the
// keys in use: it is logged once per change, and tried again at the next.
func (w *keyWatcher) check() {
	st, err := statStamp(w.path)
	if err == nil && st == w.applied {
		return
	}
	var keys [][]byte
	if err == nil {
		keys, st, err = readKeyFile(w.path)
	}
	if err == nil {
		err = w.ml.SetKeys(keys) // logs the change, if any
	}
	if err == nil {
		w.applied, w.failed = st, ""
		return
	}
	// The same file failing the same way is logged and counted once.
	if failed := fmt.Sprintf("%d %d %v", st.size, st.mod.UnixNano(), err); failed != w.failed {
		w.failed = failed
		w.errors.Inc()
		w.log.Error("gossip key file changed but cannot be applied; keeping the keys in use", "file", w.path, "err", err)
	}
}

// Close stops the watcher and waits for it.
func (w *keyWatcher) Close() {
	close(w.stop)
	<-w.done
}

// keysCollector exports the keys in use by their ids (membership.KeyID),
// never the keys: an operator checks that every node has a rotation step
// before the next.
type keysCollector struct {
	ml      *membership.Membership
	watcher *keyWatcher
}

var descGossipKey = prometheus.NewDesc("chime_gossip_key_info",
	"The gossip encryption keys in use, by id (the first 8 hex digits of the key's SHA-256); role is primary (encrypts) or secondary (only decrypts).",
	[]string{"key", "role"}, nil)

func (c keysCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descGossipKey
	c.watcher.errors.Describe(ch)
}

func (c keysCollector) Collect(ch chan<- prometheus.Metric) {
	for i, k := range c.ml.Keys() {
		role := "secondary"
		if i == 0 {
			role = "primary"
		}
		ch <- prometheus.MustNewConstMetric(descGossipKey, prometheus.GaugeValue, 1, membership.KeyID(k), role)
	}
	c.watcher.errors.Collect(ch)
}
