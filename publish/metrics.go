package publish

import "github.com/prometheus/client_golang/prometheus"

var (
	descProduced     = prometheus.NewDesc("chime_publish_produced_total", "Records Kafka acknowledged on their own topic.", nil, nil)
	descRetried      = prometheus.NewDesc("chime_publish_retries_total", "Failed produce attempts that were followed by another attempt within the same Publish call.", nil, nil)
	descDeadLettered = prometheus.NewDesc("chime_publish_dead_lettered_total", "Records Kafka acknowledged on the dead-letter topic.", nil, nil)
	descFailed       = prometheus.NewDesc("chime_publish_failed_total", "Records a Publish call returned not done (ctx ended, the publisher closed, or the dead-letter topic refused them); the shard fires them again.", nil, nil)
)

// Collector exports Stats to Prometheus, read on each scrape.
func (p *Publisher) Collector() prometheus.Collector { return collector{p} }

type collector struct{ p *Publisher }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descProduced, descRetried, descDeadLettered, descFailed} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.p.Stats()
	ch <- prometheus.MustNewConstMetric(descProduced, prometheus.CounterValue, float64(st.Produced))
	ch <- prometheus.MustNewConstMetric(descRetried, prometheus.CounterValue, float64(st.Retried))
	ch <- prometheus.MustNewConstMetric(descDeadLettered, prometheus.CounterValue, float64(st.DeadLettered))
	ch <- prometheus.MustNewConstMetric(descFailed, prometheus.CounterValue, float64(st.Failed))
}
