package shard

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the node-wide instruments the shards update. Per-shard state
// (pending, leader, applied index) is read on scrape by the host's collector.
type Metrics struct {
	// Lateness is of the events no topic rate limit held back;
	// RateLimitedLateness of those one did, and RateLimited counts, by
	// rule, the records a limit held back (one record may be counted more
	// than once).
	Lateness            prometheus.Histogram
	RateLimitedLateness prometheus.Histogram
	// TopicLateness is Lateness by the record's topic, and Early counts, by
	// topic, the records Kafka acknowledged before the time they were to
	// fire at, which the firing path's hold rules out: both for the web
	// console's timeliness page, which reads them from the node's registry.
	// Topics past the first maxTopicLabels a node fires to are labelled
	// otherTopics, so a client naming many topics cannot grow them without
	// bound.
	TopicLateness       *prometheus.HistogramVec
	Early               *prometheus.CounterVec
	topics              topicLabels
	RateLimited         *prometheus.CounterVec
	Fired               prometheus.Counter
	Orphans             prometheus.Counter
	DeadLettered        prometheus.Counter
	ScheduleBatchEvents prometheus.Histogram
	// Ingest is the time a Schedule call waits on its shard's leader for
	// its events to be committed and applied: the group commit's gathering,
	// the Raft round trip with its fsyncs, and the apply.
	Ingest        prometheus.Histogram
	LeaderChanges prometheus.Counter
	// FireStage splits a fire batch's time by stage: wake (how late after
	// its due time the batch went on: taken out of the wheel, or, for a
	// batch taken early (Tuning.FireLead), let go by its hold), slot
	// (waiting for a free firing slot), read (Pebble), hold (a batch taken
	// early waiting for its due time), stalled (observed only for a batch
	// that waited for a MarkFired stuck uncommitted, the sign of a leader
	// cut off from its followers), lease (waiting for a renewed leader
	// lease), produce (until Kafka acknowledged) and mark (until MarkFired
	// committed). A batch is late by wake, plus stalled and lease, plus, if it was not
	// taken early, slot and read.
	FireStage *prometheus.HistogramVec
}

// NewMetrics creates the instruments and registers them with reg, if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_fire_lateness_seconds",
			Help:    "Time from an event's due time (or, with a window, the point of it it was to fire at) to Kafka acknowledging its record; events a topic rate limit held back are in chime_fire_rate_limited_lateness_seconds instead.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		TopicLateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "chime_fire_topic_lateness_seconds",
			Help:    "chime_fire_lateness_seconds by the record's topic (the first 200 topics a node fires to; the rest as topic \"_other\").",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"topic"}),
		Early: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_fire_early_total",
			Help: "Records Kafka acknowledged, by this node's clock, before the time they were to fire at, by topic: the firing path holds every record until that time, so a count means a bug, or the clock stepping back while a record was produced.",
		}, []string{"topic"}),
		RateLimitedLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_fire_rate_limited_lateness_seconds",
			Help:    "Time from an event's due time to Kafka acknowledging its record, for events a topic rate limit (--topic-rate-limit) held back: lateness the limit caused.",
			Buckets: []float64{.001, .01, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}),
		RateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_fire_rate_limited_total",
			Help: "Records a topic rate limit held back, by rule (the rule's topic pattern); a record held back twice counts twice.",
		}, []string{"rule"}),
		Fired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_fired_total",
			Help: "Events produced to Kafka and marked fired by this node as leader.",
		}),
		DeadLettered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_dead_lettered_total",
			Help: "Events produced to the dead-letter topic after their last attempt failed.",
		}),
		ScheduleBatchEvents: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_schedule_batch_events",
			Help:    "Events per ScheduleBatch Raft entry (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 7),
		}),
		Ingest: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_ingest_seconds",
			Help:    "Time from a Schedule call reaching its shard's leader to its events being committed by Raft and applied: how long an ingest waits to be durable.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		LeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_shard_leadership_gained_total",
			Help: "Times a shard replica on this node became leader and started firing.",
		}),
		Orphans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_fire_orphans_total",
			Help: "Pending events overdue by 2 to 8 s that this node as leader found in no part of its firing (not in the wheel, a fire batch or a change) in two checks 2 s apart, and put back into the wheel to fire at once. The firing holds every pending event, so a count means a bug, and each such event fired up to about 6 s late instead of never.",
		}),
		FireStage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "chime_fire_stage_seconds",
			Help:    "Time a fire batch spent in each stage of firing (wake, slot, read, hold, stalled, lease, produce, mark); stalled is observed only for a batch that waited for a MarkFired stuck uncommitted.",
			Buckets: []float64{.0001, .0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"stage"}),
	}
	if reg != nil {
		reg.MustRegister(m.Lateness, m.TopicLateness, m.Early, m.RateLimitedLateness, m.RateLimited, m.Fired, m.DeadLettered, m.ScheduleBatchEvents, m.Ingest, m.LeaderChanges, m.Orphans, m.FireStage)
	}
	return m
}

// maxTopicLabels bounds the topic label values of TopicLateness and Early.
const maxTopicLabels = 200

// otherTopics labels the topics past maxTopicLabels.
const otherTopics = "_other"

// topicLabels is the topics a node has labelled a metric with.
type topicLabels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// topicLabel returns the label value for topic: the topic itself, or
// otherTopics once maxTopicLabels others have been seen.
func (m *Metrics) topicLabel(topic string) string {
	t := &m.topics
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.seen[topic]; ok {
		return topic
	}
	if len(t.seen) >= maxTopicLabels {
		return otherTopics
	}
	if t.seen == nil {
		t.seen = make(map[string]struct{})
	}
	t.seen[topic] = struct{}{}
	return topic
}

// observeFired records the lateness of a record of topic fired late
// seconds after the time it was to fire at.
func (m *Metrics) observeFired(topic string, late float64) {
	label := m.topicLabel(topic)
	m.TopicLateness.WithLabelValues(label).Observe(late)
	if late < 0 {
		m.Early.WithLabelValues(label).Inc()
	}
}
