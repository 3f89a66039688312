package console

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// The timeliness page shows how late the shard leaders fired, per topic,
// over the last hour and the last day, from the node's own metrics: the
// Console samples its node's registry every sampleEvery and keeps rings of
// the samples, so the page needs no Prometheus. A node's metrics count what
// its own shard leaders fired; the page gathers every live node's figures
// (timelinessJSON, over the HTTP port) for the cluster's.

// sampleEvery is how often the sampler reads the node's registry. A page
// reads it once more when it is shown, so its figures end at that moment.
const sampleEvery = 10 * time.Second

// The rings: one sample a minute for the last hour, one every ten minutes
// for the last day, and one more of each so that a full window has a sample
// at (or just before) its start. Per topic, a sample holds 17 bucket
// counts: with the 200 topics a node labels at most, both rings hold 5.6 MB;
// with ten, 280 KB.
var (
	hourRing = ringSpec{step: time.Minute, keep: 61}
	dayRing  = ringSpec{step: 10 * time.Minute, keep: 145}
)

// Metric families the sampler reads (shard.Metrics, publish.Collector,
// the shard host's collector).
const (
	metricTopicLateness = "chime_fire_topic_lateness_seconds"
	metricEarly         = "chime_fire_early_total"
	metricRetries       = "chime_publish_retries_total"
	metricFailed        = "chime_publish_failed_total"
	metricDeadLettered  = "chime_dead_lettered_total"
	metricRefired       = "chime_shard_refired_total"
)

// histo is a topic's lateness histogram and early count, cumulative as the
// registry keeps them or the difference of two samples: Buckets holds the
// count of observations at or below each bound, then the count of all.
type histo struct {
	Buckets []float64 `json:"buckets"`
	Sum     float64   `json:"sum"`
	Early   float64   `json:"early"`
}

func (h histo) count() float64 {
	if len(h.Buckets) == 0 {
		return 0
	}
	return h.Buckets[len(h.Buckets)-1]
}

// minus returns h's counts since base, or h's own after a reset (a
// registry counts from zero again only when its node restarts, and a new
// node's console samples it from the start).
func (h histo) minus(base histo) histo {
	if len(base.Buckets) != len(h.Buckets) || base.count() > h.count() {
		return h
	}
	d := histo{Buckets: make([]float64, len(h.Buckets)), Sum: h.Sum - base.Sum, Early: h.Early - base.Early}
	for i := range h.Buckets {
		d.Buckets[i] = h.Buckets[i] - base.Buckets[i]
	}
	return d
}

// plus returns h and o summed (of the same bounds).
func (h histo) plus(o histo) histo {
	if len(h.Buckets) == 0 {
		h.Buckets = make([]float64, len(o.Buckets))
	} else {
		h.Buckets = slices.Clone(h.Buckets)
	}
	for i := range min(len(h.Buckets), len(o.Buckets)) {
		h.Buckets[i] += o.Buckets[i]
	}
	h.Sum += o.Sum
	h.Early += o.Early
	return h
}

// sample is the node's cumulative figures at one moment. The zero sample a
// sampler starts with stands for its node's registry when it was created,
// when every counter the node keeps in memory was zero; it knows nothing of
// the refires, which each shard counts in its replicated state.
type sample struct {
	at     time.Time
	zero   bool
	bounds []float64
	topics map[string]histo
	// Counters of the node's publisher and shard leaders.
	retries, failed, deadLettered float64
	refired                       map[string]float64 // by shard
}

// gatherSample reads a sample from g.
func gatherSample(g prometheus.Gatherer, at time.Time) (sample, error) {
	mfs, err := g.Gather()
	if err != nil && len(mfs) == 0 {
		return sample{}, err
	}
	s := sample{at: at, topics: map[string]histo{}, refired: map[string]float64{}}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case metricTopicLateness:
				h := m.GetHistogram()
				var bounds, cum []float64
				for _, b := range h.GetBucket() {
					if math.IsInf(b.GetUpperBound(), 1) {
						continue
					}
					bounds = append(bounds, b.GetUpperBound())
					cum = append(cum, float64(b.GetCumulativeCount()))
				}
				if s.bounds == nil {
					s.bounds = bounds
				} else if !slices.Equal(s.bounds, bounds) {
					continue // one binary gives every topic the same buckets
				}
				topic := labelOf(m, "topic")
				t := s.topics[topic]
				t.Buckets, t.Sum = append(cum, float64(h.GetSampleCount())), h.GetSampleSum()
				s.topics[topic] = t
			case metricEarly:
				topic := labelOf(m, "topic")
				t := s.topics[topic]
				t.Early = m.GetCounter().GetValue()
				s.topics[topic] = t
			case metricRetries:
				s.retries = m.GetCounter().GetValue()
			case metricFailed:
				s.failed = m.GetCounter().GetValue()
			case metricDeadLettered:
				s.deadLettered = m.GetCounter().GetValue()
			case metricRefired:
				s.refired[labelOf(m, "shard")] = m.GetCounter().GetValue()
			}
		}
	}
	for topic, t := range s.topics { // an early count read before its topic's histogram
		if len(t.Buckets) != len(s.bounds)+1 {
			t.Buckets = make([]float64, len(s.bounds)+1)
			s.topics[topic] = t
		}
	}
	return s, nil
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// ringSpec is how a ring keeps samples: the first sample of each step
// (of wall-clock time), the newest keep of them.
type ringSpec struct {
	step time.Duration
	keep int
}

// ring holds samples, oldest first.
type ring struct {
	ringSpec
	samples []sample
}

// offer keeps s if it is the first sample of its step.
func (r *ring) offer(s sample) {
	if n := len(r.samples); n > 0 && r.samples[n-1].at.Truncate(r.step).Equal(s.at.Truncate(r.step)) {
		return
	}
	if len(r.samples) == r.keep {
		copy(r.samples, r.samples[1:])
		r.samples = r.samples[:r.keep-1]
	}
	r.samples = append(r.samples, s)
}

// since returns the samples from the last one at or before t (the first
// one, when none is) to the newest.
func (r *ring) since(t time.Time) []sample {
	i := sort.Search(len(r.samples), func(i int) bool { return r.samples[i].at.After(t) })
	return r.samples[max(0, i-1):]
}

// sampler samples a node's registry every sampleEvery into rings, on its
// own goroutine, until stop.
type sampler struct {
	gather prometheus.Gatherer
	now    func() time.Time

	mu        sync.Mutex
	hour, day ring
	err       error // of the last gather

	stop, done chan struct{}
}

func newSampler(g prometheus.Gatherer, now func() time.Time) *sampler {
	s := &sampler{gather: g, now: now, hour: ring{ringSpec: hourRing}, day: ring{ringSpec: dayRing},
		stop: make(chan struct{}), done: make(chan struct{})}
	zero := sample{at: now(), zero: true}
	s.hour.offer(zero)
	s.day.offer(zero)
	go s.run()
	return s
}

func (s *sampler) run() {
	defer close(s.done)
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			// A failed gather is kept in s.err, which the page shows.
			_, _ = s.take()
		}
	}
}

// take reads a sample into the rings and returns it.
func (s *sampler) take() (sample, error) {
	smp, err := gatherSample(s.gather, s.now())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
	if err == nil {
		s.hour.offer(smp)
		s.day.offer(smp)
	}
	return smp, err
}

// close stops the sampling goroutine and waits for it.
func (s *sampler) close() {
	close(s.stop)
	<-s.done
}

// windowFigures are a node's figures over one window.
type windowFigures struct {
	Window  float64 `json:"window_seconds"`
	Covered float64 `json:"covered_seconds"` // less than Window while the node's rings are younger
	// From the node's registry: what its shard leaders fired, per topic,
	// and its publisher's retries and failures.
	Bounds       []float64        `json:"bounds"`
	Topics       map[string]histo `json:"topics"`
	Retries      float64          `json:"produce_retries"`
	Failed       float64          `json:"produce_failed"`
	DeadLettered float64          `json:"dead_lettered"`
	// Refires by shard, from the node's replicas: every replica of a shard
	// counts the shard's, so the cluster's are the most any node saw.
	Refired map[string]float64 `json:"refired"`
}

// point is one step of a chart: the lateness of every topic together.
type point struct {
	At      int64     `json:"at"` // Unix seconds
	Buckets []float64 `json:"buckets"`
}

// nodeFigures is what a node tells of its timeliness (timelinessJSON).
type nodeFigures struct {
	Node    string          `json:"node"`
	Error   string          `json:"error,omitempty"`
	Bounds  []float64       `json:"bounds"`
	Windows []windowFigures `json:"windows"` // the last hour, the last day
	Hour    []point         `json:"hour"`    // per minute
	Day     []point         `json:"day"`     // per ten minutes
}

// figures returns the node's figures, up to a sample read now.
func (s *sampler) figures(node string) nodeFigures {
	latest, err := s.take()
	nf := nodeFigures{Node: node}
	if err != nil {
		nf.Error = "reading the node's metrics: " + err.Error()
		return nf
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	nf.Bounds = latest.bounds
	for _, r := range []*ring{&s.hour, &s.day} {
		window := time.Duration(r.keep-1) * r.step
		ss := r.since(latest.at.Add(-window))
		nf.Windows = append(nf.Windows, windowOf(ss, latest, window))
		pts := make([]point, 0, len(ss))
		for i := 1; i < len(ss); i++ {
			pts = append(pts, point{At: ss[i-1].at.Truncate(r.step).Unix(), Buckets: allTopics(ss[i]).minus(allTopics(ss[i-1])).Buckets})
		}
		// The step now is in, so far.
		if last := ss[len(ss)-1]; latest.at.After(last.at) {
			pts = append(pts, point{At: last.at.Truncate(r.step).Unix(), Buckets: allTopics(latest).minus(allTopics(last)).Buckets})
		}
		if r == &s.hour {
			nf.Hour = pts
		} else {
			nf.Day = pts
		}
	}
	return nf
}

// allTopics is s's lateness of every topic together.
func allTopics(s sample) histo {
	h := histo{Buckets: make([]float64, len(s.bounds)+1)}
	for _, t := range s.topics {
		h = h.plus(t)
	}
	return h
}

// windowOf returns the figures from ss's first sample to latest; ss is a
// ring's samples of the window.
func windowOf(ss []sample, latest sample, window time.Duration) windowFigures {
	base := ss[0]
	w := windowFigures{Window: window.Seconds(), Covered: min(window, latest.at.Sub(base.at)).Seconds(), Bounds: latest.bounds,
		Topics: map[string]histo{}, Refired: map[string]float64{}}
	for topic, h := range latest.topics {
		b, ok := base.topics[topic]
		if !ok {
			b = histo{Buckets: make([]float64, len(h.Buckets))}
		}
		w.Topics[topic] = h.minus(b)
	}
	counter := func(now, then float64) float64 {
		if then > now {
			return now
		}
		return now - then
	}
	w.Retries, w.Failed, w.DeadLettered = counter(latest.retries, base.retries), counter(latest.failed, base.failed), counter(latest.deadLettered, base.deadLettered)
	// A shard's refires are replicated state, counted since the shard was
	// created: from the first sample that has the shard.
	for shard, n := range latest.refired {
		for _, smp := range ss {
			if then, ok := smp.refired[shard]; ok {
				w.Refired[shard] = counter(n, then)
				break
			}
		}
	}
	return w
}

// quantile estimates the q-quantile of the observations cum counts (at or
// below each of bounds, then all of them) as Prometheus's
// histogram_quantile does: linearly within the bucket the rank falls in,
// the first bucket from 0; the highest bound for a rank past it; NaN for no
// observations.
func quantile(q float64, bounds, cum []float64) float64 {
	if len(cum) != len(bounds)+1 || len(bounds) == 0 || cum[len(cum)-1] <= 0 {
		return math.NaN()
	}
	rank := q * cum[len(cum)-1]
	i := sort.Search(len(cum), func(i int) bool { return cum[i] >= rank })
	if i >= len(bounds) {
		return bounds[len(bounds)-1]
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = bounds[i-1], cum[i-1]
	}
	in := cum[i] - below
	if in <= 0 {
		return bounds[i]
	}
	return lower + (bounds[i]-lower)*(rank-below)/in
}

// highest returns the bound of the highest bucket cum counts an
// observation in, and whether it is past the last bound; ok is false for
// no observations.
func highest(bounds, cum []float64) (bound float64, past, ok bool) {
	for i := len(cum) - 1; i >= 0; i-- {
		below := 0.0
		if i > 0 {
			below = cum[i-1]
		}
		if cum[i]-below > 0 {
			if i == len(bounds) {
				return bounds[len(bounds)-1], true, true
			}
			return bounds[i], false, true
		}
	}
	return 0, false, false
}

// seconds shows a lateness: "0.5 ms", "12.3 ms", "2.5 s"; "–" for none.
func seconds(s float64) string {
	switch {
	case math.IsNaN(s):
		return "–"
	case s < 1:
		return strconv.FormatFloat(s*1000, 'g', 3, 64) + " ms"
	}
	return strconv.FormatFloat(s, 'g', 3, 64) + " s"
}

// lateRow is one line of the page's table.
type lateRow struct {
	Topic                   string
	Fired                   int64
	P50, P99, Max, MaxTitle string
	Early                   int64
}

func lateRowOf(topic string, bounds []float64, h histo) lateRow {
	r := lateRow{Topic: topic, Fired: int64(h.count()), Early: int64(h.Early),
		P50: seconds(quantile(.5, bounds, h.Buckets)), P99: seconds(quantile(.99, bounds, h.Buckets)), Max: "–"}
	if b, past, ok := highest(bounds, h.Buckets); ok {
		r.Max, r.MaxTitle = "≤ "+seconds(b), "the highest bucket of the lateness histogram that holds an event"
		if past {
			r.Max = "> " + seconds(b)
		}
	}
	return r
}

// windowView is one window of the page.
type windowView struct {
	Name                                 string
	Rows                                 []lateRow
	All                                  lateRow
	Retries, Failed, DeadLettered, Dupes int64
	Short                                []string // nodes whose figures cover less than the window
}

// mergeWindows sums the nodes' figures of window i.
func mergeWindows(nodes []nodeFigures, i int, name string) windowView {
	v := windowView{Name: name}
	var bounds []float64
	topics := map[string]histo{}
	refired := map[string]float64{}
	for _, n := range nodes {
		if n.Error != "" || i >= len(n.Windows) {
			continue
		}
		w := n.Windows[i]
		if bounds == nil {
			bounds = w.Bounds
		}
		if w.Covered < w.Window*0.99 {
			v.Short = append(v.Short, fmt.Sprintf("%s (%s)", n.Node, time.Duration(w.Covered*float64(time.Second)).Round(time.Second)))
		}
		for t, h := range w.Topics {
			topics[t] = topics[t].plus(h)
		}
		v.Retries += int64(w.Retries)
		v.Failed += int64(w.Failed)
		v.DeadLettered += int64(w.DeadLettered)
		for s, r := range w.Refired {
			refired[s] = max(refired[s], r)
		}
	}
	var all histo
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	slices.Sort(names)
	for _, t := range names {
		v.Rows = append(v.Rows, lateRowOf(t, bounds, topics[t]))
		all = all.plus(topics[t])
	}
	v.All = lateRowOf("all topics", bounds, all)
	for _, r := range refired {
		v.Dupes += int64(r)
	}
	return v
}

// chartData is a chart of steps of time, embedded in its page as JSON for
// static/charts.js, which draws it with uPlot: the page's table says the
// same without JavaScript.
type chartData struct {
	Title  string        `json:"title"`
	At     []int64       `json:"at"` // Unix seconds each step starts at
	Series []chartSeries `json:"series"`
}

// chartSeries is one line (or bars) of a chart; nil values are gaps.
type chartSeries struct {
	Label  string     `json:"label"`
	Unit   string     `json:"unit"` // the axis it is read on: "ms" or "events"
	Bars   bool       `json:"bars,omitempty"`
	Values []*float64 `json:"values"`
}

func mergeChart(nodes []nodeFigures, pick func(nodeFigures) []point, title string) chartData {
	var bounds []float64
	byAt := map[int64]histo{}
	for _, n := range nodes {
		if n.Error != "" {
			continue
		}
		if bounds == nil {
			bounds = n.Bounds
		}
		for _, p := range pick(n) {
			byAt[p.At] = byAt[p.At].plus(histo{Buckets: p.Buckets})
		}
	}
	c := chartData{Title: title, At: []int64{}}
	for at := range byAt {
		c.At = append(c.At, at)
	}
	slices.Sort(c.At)
	p50 := chartSeries{Label: "p50 lateness", Unit: "ms", Values: []*float64{}}
	p99 := chartSeries{Label: "p99 lateness", Unit: "ms", Values: []*float64{}}
	fired := chartSeries{Label: "fired", Unit: "events", Bars: true, Values: []*float64{}}
	ms := func(q float64, h histo) *float64 {
		v := quantile(q, bounds, h.Buckets)
		if math.IsNaN(v) {
			return nil
		}
		v *= 1000
		return &v
	}
	for _, at := range c.At {
		h := byAt[at]
		n := h.count()
		p50.Values, p99.Values, fired.Values = append(p50.Values, ms(.5, h)), append(p99.Values, ms(.99, h)), append(fired.Values, &n)
	}
	c.Series = []chartSeries{fired, p50, p99}
	return c
}

// peerFetchTimeout bounds how long a node that does not answer holds the
// timeliness page up.
const peerFetchTimeout = 3 * time.Second

// clusterFigures returns this node's figures and every other live member's,
// fetched from its HTTP port in parallel; a node that does not answer is
// listed with the error.
func (c *Console) clusterFigures(ctx context.Context, s *session) ([]nodeFigures, error) {
	nodes := []nodeFigures{c.samples.figures(c.cfg.NodeID)}
	cl, err := c.clientFor(s)
	if err != nil {
		return nodes, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	m, err := chimev1.NewAdminClient(cl.Conn()).GetClusterMap(ctx, &chimev1.GetClusterMapRequest{})
	if err != nil {
		return nodes, err
	}
	var others []*chimev1.Member
	for _, mem := range m.GetMembers() {
		switch mem.GetState() {
		case "alive", "suspect", "draining":
			if mem.GetId() != c.cfg.NodeID {
				others = append(others, mem)
			}
		}
	}
	got := make([]nodeFigures, len(others))
	var wg sync.WaitGroup
	for i, mem := range others {
		wg.Go(func() { got[i] = c.fetchFigures(ctx, mem) })
	}
	wg.Wait()
	return append(nodes, got...), nil
}

// fetchFigures reads a member's figures from its timeliness.json.
func (c *Console) fetchFigures(ctx context.Context, m *chimev1.Member) nodeFigures {
	nf := nodeFigures{Node: m.GetId()}
	if m.GetHttpAddr() == "" {
		nf.Error = "it advertises no HTTP address"
		return nf
	}
	scheme := "http"
	if c.cfg.TLS != nil {
		scheme = "https"
	}
	ctx, cancel := context.WithTimeout(ctx, peerFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+m.GetHttpAddr()+"/ui/timeliness.json", nil)
	if err != nil {
		nf.Error = err.Error()
		return nf
	}
	resp, err := c.peerHTTP().Do(req)
	if err != nil {
		nf.Error = err.Error()
		return nf
	}
	defer func() { _ = resp.Body.Close() }() // the body was read, or the answer is refused already
	if resp.StatusCode != http.StatusOK {
		nf.Error = "its console answered " + resp.Status + " (a node without the console, or with one of another version, cannot tell)"
		return nf
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&nf); err != nil {
		return nodeFigures{Node: m.GetId(), Error: "its figures do not decode: " + err.Error()}
	}
	if nf.Node != m.GetId() {
		return nodeFigures{Node: m.GetId(), Error: fmt.Sprintf("its figures name node %q", nf.Node)}
	}
	return nf
}

// peerHTTP is the client that fetches other nodes' figures. Under TLS it
// checks that the server is a node of the cluster, as Config.TLS does, and
// presents no certificate: the figures need no authority, and the console
// uses none of the node's.
func (c *Console) peerHTTP() *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peers == nil {
		var tc *tls.Config
		if c.cfg.TLS != nil {
			tc = c.cfg.TLS.Clone()
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
			tc.Certificates = nil
		}
		c.peers = &http.Client{Timeout: peerFetchTimeout, Transport: &http.Transport{TLSClientConfig: tc}}
	}
	return c.peers
}

// timelinessJSON serves this node's figures to the other nodes' consoles.
// Like /metrics on the same port, it asks for no sign-in: the figures are
// the node's metrics, kept over time, and say nothing /metrics does not.
func (c *Console) timelinessJSON(w http.ResponseWriter, r *http.Request) {
	if c.samples == nil {
		http.Error(w, "this node's console keeps no metrics", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(c.samples.figures(c.cfg.NodeID)) // the caller may have gone
}

func (c *Console) timelinessPage(w http.ResponseWriter, r *http.Request, s *session) {
	if c.samples == nil {
		c.fail(w, r, s, errors.New("this node's console was started without its metrics registry, so it has no timeliness figures"))
		return
	}
	thisNode := r.URL.Query().Get("node") == "this"
	var nodes []nodeFigures
	var clusterErr error
	if thisNode {
		nodes = []nodeFigures{c.samples.figures(c.cfg.NodeID)}
	} else {
		nodes, clusterErr = c.clusterFigures(r.Context(), s)
	}
	data := map[string]any{
		"ThisNode": thisNode,
		"Hour":     mergeWindows(nodes, 0, "Last hour"),
		"Day":      mergeWindows(nodes, 1, "Last day"),
		"Charts": []chartData{
			mergeChart(nodes, func(n nodeFigures) []point { return n.Hour }, "Last hour, per minute"),
			mergeChart(nodes, func(n nodeFigures) []point { return n.Day }, "Last day, per 10 minutes"),
		},
	}
	if clusterErr != nil {
		data["ClusterError"] = clusterErr.Error()
	}
	type nodeRow struct{ Node, Hour, Day, Error string }
	var rows []nodeRow
	for _, n := range nodes {
		row := nodeRow{Node: n.Node, Error: n.Error}
		for i, w := range n.Windows {
			covered := time.Duration(w.Covered * float64(time.Second)).Round(time.Second).String()
			if i == 0 {
				row.Hour = covered
			} else {
				row.Day = covered
			}
		}
		rows = append(rows, row)
	}
	data["NodeRows"] = rows
	c.render(w, r, s, "timeliness", http.StatusOK, data)
}
