package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// nodeCollector exports what an alert needs about the node as a whole: the
// replication factor the shards' voter counts are compared with, and the
// room left on the disk of the data directory, where Pebble and the Raft
// logs stop every write of the node when it runs out.
type nodeCollector struct {
	replication int
	dataDir     string
}

var (
	descReplication = prometheus.NewDesc("chime_replication_factor", "Replicas (Raft voters) each shard should have: the cluster's replication factor, fixed when it was created.", nil, nil)
	descDiskFree    = prometheus.NewDesc("chime_data_dir_free_bytes", "Bytes available to chimed on the filesystem holding --data-dir.", nil, nil)
	descDiskSize    = prometheus.NewDesc("chime_data_dir_size_bytes", "Size in bytes of the filesystem holding --data-dir.", nil, nil)
)

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReplication
	ch <- descDiskFree
	ch <- descDiskSize
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descReplication, prometheus.GaugeValue, float64(c.replication))
	var st unix.Statfs_t
	if err := unix.Statfs(c.dataDir, &st); err == nil {
		ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, float64(st.Bavail)*float64(st.Bsize))
		ch <- prometheus.MustNewConstMetric(descDiskSize, prometheus.GaugeValue, float64(st.Blocks)*float64(st.Bsize))
	}
}
