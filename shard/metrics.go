package shard

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the node-wide instruments the shards update. Per-shard state
// (pending, leader, applied index) is read on scrape by the host's collector.
type Metrics struct {
	Lateness            prometheus.Histogram
	Fired               prometheus.Counter
	DeadLettered        prometheus.Counter
	ScheduleBatchEvents prometheus.Histogram
	LeaderChanges       prometheus.Counter
	// FireStage splits a fire batch's time by stage: wake (how late after
	// its due time the batch went on: taken out of the wheel, or, for a
	// batch taken early (Tuning.FireLead), let go by its hold), slot
	// (waiting for a free firing slot), read (Pebble), hold (a batch taken
	// early waiting for its due time), lease (waiting for a renewed leader
	// lease), produce (until Kafka acknowledged) and mark (until MarkFired
	// committed). A batch is late by wake, plus lease, plus, if it was not
	// taken early, slot and read.
	FireStage *prometheus.HistogramVec
}

// NewMetrics creates the instruments and registers them with reg, if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_fire_lateness_seconds",
			Help:    "Time from an event's due time to Kafka acknowledging its record.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
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
		LeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_shard_leadership_gained_total",
			Help: "Times a shard replica on this node became leader and started firing.",
		}),
		FireStage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "chime_fire_stage_seconds",
			Help:    "Time a fire batch spent in each stage of firing (wake, slot, read, hold, lease, produce, mark).",
			Buckets: []float64{.0001, .0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"stage"}),
	}
	if reg != nil {
		reg.MustRegister(m.Lateness, m.Fired, m.DeadLettered, m.ScheduleBatchEvents, m.LeaderChanges, m.FireStage)
	}
	return m
}
