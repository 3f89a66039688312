package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// appendLog records when the broker (in this process) received each record,
// on the history's clock. A record's own timestamp is the producer's clock,
// which the skew nemesis moves, and kfake applies LogAppendTime only when
// the producer asks for it; so the time a record reached Kafka is taken
// here, from the produce request, before the broker handles it.
type appendLog struct {
	mu sync.Mutex
	at map[appendKey]int64 // unix ns of the first produce request carrying the record
	// last is when the broker last took a produce request (unix ns; 0:
	// none yet), for watchStalls.
	last atomic.Int64
}

// appendKey names one produced copy: an id is produced again only by a
// retry (another chime-attempt) or another firing (another
// chime-fired-unix-ms).
type appendKey struct {
	topic, id string
	firedMs   int64
	attempt   int
}

// keyOf names the copy a record with headers h on topic is.
func keyOf(topic string, h chimev1.Headers) appendKey {
	k := appendKey{topic: topic, id: h.ID, attempt: h.Attempt}
	if !h.Fired.IsZero() {
		k.firedMs = h.Fired.UnixMilli()
	}
	return k
}

func watchProduces(c *kfake.Cluster) *appendLog {
	l := &appendLog{at: map[appendKey]int64{}}
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		now := time.Now().UnixNano()
		l.last.Store(now)
		pr, ok := req.(*kmsg.ProduceRequest)
		if !ok {
			return nil, nil, false
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, t := range pr.Topics {
			for _, p := range t.Partitions {
				eachRecord(p.Records, func(r *kmsg.Record) {
					h, _ := chimev1.ParseHeaders(r.Headers) // a malformed header leaves its field zero
					k := keyOf(t.Topic, h)
					if _, seen := l.at[k]; !seen {
						l.at[k] = now
					}
				})
			}
		}
		return nil, nil, false // not handled: the broker goes on as usual
	})
	return l
}

const (
	// stallAfter is how long the broker may take no produce request before
	// watchStalls reports it; maxStallDumps bounds the goroutine dumps of a
	// run. At 600 ms, packet loss on four nodes (fewer firings, and the
	// workload's clients waiting out timeouts instead of producing to the
	// ingest topic) used up all eight dumps within 12 s; a stop of the
	// driver's process is logged as a late tick however short.
	stallAfter    = time.Second
	maxStallDumps = 8
	stallTick     = 250 * time.Millisecond
	// nodeDumpWait bounds the wait for the nodes' goroutine dumps.
	nodeDumpWait = 3 * time.Second
)

// watchStalls, until ctx ends, logs each time the broker has taken no
// produce request for stallAfter, and writes what every goroutine of this
// process is doing then to <out>/stall-N.txt, and of each node nodes
// returns to <out>/stall-N-<node>.txt. The broker serves every request from
// one goroutine of this process; the silences runs have seen (0.5-3 s) were
// this whole process not running while the nodes waited on the broker, and
// a tick that comes late says so, with what the collector did meanwhile.
// Some silences are the fault's own (a kill-all leaves nobody to produce),
// which the log's fault windows tell.
func (l *appendLog) watchStalls(ctx context.Context, out string, nodes func() []*node, logger *slog.Logger) {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	prev, prevGC, dumps, reported := time.Now(), readGC(), 0, false
	lastGC := prevGC // at the last tick the broker was busy
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			now = time.Now()
		}
		gc := readGC()
		if late := now.Sub(prev) - stallTick; late > 2*stallTick {
			logger.Warn("the driver's stall watch woke late: this process did not run", append([]any{"late", late.Round(time.Millisecond)}, gc.since(prevGC)...)...)
		}
		prev, prevGC = now, gc
		last := l.last.Load()
		if last == 0 {
			continue
		}
		idle := now.Sub(time.Unix(0, last))
		if idle < stallAfter {
			reported, lastGC = false, gc
			continue
		}
		if reported {
			continue
		}
		reported = true
		attrs := []any{"since", time.Unix(0, last).Format("15:04:05.000")}
		if dumps < maxStallDumps {
			dumps++
			path := filepath.Join(out, fmt.Sprintf("stall-%d.txt", dumps))
			if err := dumpGoroutines(path); err != nil {
				attrs = append(attrs, "err", err)
			} else {
				attrs = append(attrs, "goroutines", path)
			}
			if errs := dumpNodes(ctx, strings.TrimSuffix(path, ".txt"), nodes()); len(errs) > 0 {
				attrs = append(attrs, "node_dump_errors", errs)
			}
			prev = time.Now() // the dumps' own time is no lateness
		}
		attrs = append(attrs, "idle", idle.Round(time.Millisecond))
		logger.Warn("the broker has taken no produce request for a while", append(attrs, gc.since(lastGC)...)...)
	}
}

// gcState is this process's garbage collection so far, and the machine's
// CPU pressure: whether a silence is the collector's, or the driver's
// threads waiting for a CPU the nodes hold.
type gcState struct {
	cycles   int64
	pause    time.Duration
	heap     uint64
	pressure string // /proc/pressure/cpu's "some" line, where the kernel has one
}

func readGC() gcState {
	var st debug.GCStats
	debug.ReadGCStats(&st)
	// runtime/metrics, not ReadMemStats, which stops the world it watches.
	heap := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(heap)
	g := gcState{cycles: st.NumGC, pause: st.PauseTotal}
	if heap[0].Value.Kind() == metrics.KindUint64 {
		g.heap = heap[0].Value.Uint64()
	}
	if b, err := os.ReadFile("/proc/pressure/cpu"); err == nil {
		g.pressure, _, _ = strings.Cut(string(b), "\n")
	}
	return g
}

// since describes what the collector did from prev to g, as log
// attributes.
func (g gcState) since(prev gcState) []any {
	return []any{"gc_cycles", g.cycles - prev.cycles, "gc_pause", (g.pause - prev.pause).Round(time.Microsecond),
		"heap_mib", g.heap >> 20, "cpu_pressure", g.pressure}
}

// dumpNodes writes each live node's goroutines to <prefix>-<node>.txt, all
// at once, waiting at most nodeDumpWait, and returns what failed.
func dumpNodes(ctx context.Context, prefix string, nodes []*node) []string {
	ctx, cancel := context.WithTimeout(ctx, nodeDumpWait)
	defer cancel()
	var (
		mu   sync.Mutex
		errs []string
		wg   sync.WaitGroup
	)
	for _, n := range nodes {
		if !n.alive() {
			continue
		}
		wg.Go(func() {
			b, err := n.goroutines(ctx)
			if err == nil {
				err = os.WriteFile(prefix+"-"+n.id+".txt", b, 0o644)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, n.id+": "+err.Error())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs
}

// dumpGoroutines writes every goroutine's stack to path.
func dumpGoroutines(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("goroutine").WriteTo(f, 2); err != nil {
		_ = f.Close() // the write's error is the one to report
		return err
	}
	return f.Close()
}

func (l *appendLog) lookup(k appendKey) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.at[k]
	return t, ok
}

// eachRecord walks the record batches of a produce request. Compressed
// batches are skipped (Chime's producer does not compress).
func eachRecord(buf []byte, fn func(*kmsg.Record)) {
	for len(buf) >= 12 {
		n := 12 + int(binary.BigEndian.Uint32(buf[8:12]))
		if n > len(buf) {
			return
		}
		var b kmsg.RecordBatch
		if err := b.ReadFrom(buf[:n]); err != nil || b.Attributes&0x07 != 0 {
			buf = buf[n:]
			continue
		}
		recs := b.Records
		for i := int32(0); i < b.NumRecords && len(recs) > 0; i++ {
			l, w := binary.Varint(recs)
			if w <= 0 || int(l)+w > len(recs) {
				break
			}
			var r kmsg.Record
			if r.ReadFrom(recs[:w+int(l)]) == nil {
				fn(&r)
			}
			recs = recs[w+int(l):]
		}
		buf = buf[n:]
	}
}
