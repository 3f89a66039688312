package ingest

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a Consumer's; a node registers them once (Collectors).
type Metrics struct {
	records  *prometheus.CounterVec
	rejected *prometheus.CounterVec
	lag      *prometheus.GaugeVec
	// partitions counts the partitions of each topic the group gave this node.
	partitions *prometheus.GaugeVec
	apply      prometheus.Histogram
	retries    prometheus.Counter
}

// NewMetrics makes the ingest metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_ingest_topic_records_total",
			Help: "Records of the ingest topics this node applied, by topic and result: scheduled, cancelled, " +
				"skipped (Chime's own tombstone back), stale (read again after a newer record of its id), " +
				"superseded (a schedule a later record of the same fetch cancels), dry_run (validated only: --ingest-dry-run) or rejected.",
		}, []string{"topic", "result"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_ingest_topic_rejected_total",
			Help: "Records of the ingest topics this node produced to the rejected topic, by topic and reason (the field the error names).",
		}, []string{"topic", "reason"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "chime_ingest_topic_lag_records",
			Help: "Records of an ingest partition this node consumes that are not applied yet: the partition's end minus the committed offset.",
		}, []string{"topic", "partition"}),
		partitions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "chime_ingest_topic_partitions",
			Help: "Partitions of an ingest topic the consumer group gave this node.",
		}, []string{"topic"}),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_ingest_topic_apply_seconds",
			Help:    "Time from fetching a run of an ingest partition's records to all of them being committed by Raft or rejected.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_ingest_topic_retries_total",
			Help: "Calls of the ingest path that failed in a way that may pass later (no leader, a shard that takes no writes, a rate limit) and were made again; the partition waited meanwhile.",
		}),
	}
}

// Collectors are the metrics, to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.records, m.rejected, m.lag, m.partitions, m.apply, m.retries}
}
