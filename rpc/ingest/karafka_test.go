package ingest

import (
	"testing"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// karafkaSchedule is the headers Karafka's Proxy.schedule puts on a proxy
// record, after the message's own (extra, in pairs), for a target topic
// "out" and epoch 1700000000; more adds schedule_target_* headers.
func karafkaSchedule(extra []string, more ...string) []string {
	hs := append([]string{}, extra...)
	hs = append(hs,
		"schedule_schema_version", "1.0.0",
		"schedule_target_epoch", "1700000000",
		"schedule_source_type", "schedule",
		"schedule_target_topic", "out")
	return append(hs, more...)
}

// karafkaSourced is hs followed by the headers Karafka's dispatcher adds
// for a proxy record with key k at schedSource, then chime-source.
func karafkaSourced(k string, hs ...string) []*chimev1.Header {
	hs = append(append([]string{}, hs...),
		"schedule_source_topic", schedTopic,
		"schedule_source_partition", "3",
		"schedule_source_offset", "42",
		"schedule_source_key", k)
	return withSource(eventHeaders(hs...)...)
}

func TestKarafkaFormat(t *testing.T) {
	cancel := []string{"schedule_schema_version", "1.0.0", "schedule_source_type", "cancel"}
	runDecodeCases(t, "karafka", []decodeCase{
		{
			name: "every target attribute, the message's headers kept",
			rec: schedRecord("k", []byte("payload"), karafkaSchedule([]string{"trace", "t1"},
				"schedule_target_partition", "2",
				"schedule_target_key", "user-1")...),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out",
				Key: []byte("user-1"), Partition: partitionOf(2), Payload: []byte("payload"),
				Headers: karafkaSourced("k", karafkaSchedule([]string{"trace", "t1"},
					"schedule_target_partition", "2",
					"schedule_target_key", "user-1")...),
				OnConflict: onReplace,
			}}},
		},
		{
			name: "topic and epoch only: no key, Kafka's partitioning",
			opts: DecodeOptions{IDFromKey: true},
			rec:  schedRecord("out-5f0c", []byte("p"), karafkaSchedule(nil)...),
			want: Op{Events: []*chimev1.Event{{
				Id: "out-5f0c", DeliverAt: unixAt(1700000000, 0), Topic: "out", Payload: []byte("p"),
				Headers:    karafkaSourced("out-5f0c", karafkaSchedule(nil)...),
				OnConflict: onReplace,
			}}},
		},
		{
			name: "a null value dispatches a tombstone",
			rec:  schedRecord("k", nil, karafkaSchedule(nil, "schedule_target_key", "user-1")...),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out", Key: []byte("user-1"),
				Tombstone:  true,
				Headers:    karafkaSourced("k", karafkaSchedule(nil, "schedule_target_key", "user-1")...),
				OnConflict: onReplace,
			}}},
		},
		{
			name: "a partition key alone becomes the key",
			rec:  schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_partition_key", "acct-9")...),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out", Key: []byte("acct-9"), Payload: []byte("p"),
				Headers:    karafkaSourced("k", karafkaSchedule(nil, "schedule_target_partition_key", "acct-9")...),
				OnConflict: onReplace,
			}}},
		},
		{
			name: "a partition key equal to the key",
			rec:  schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_key", "acct-9", "schedule_target_partition_key", "acct-9")...),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out", Key: []byte("acct-9"), Payload: []byte("p"),
				Headers:    karafkaSourced("k", karafkaSchedule(nil, "schedule_target_key", "acct-9", "schedule_target_partition_key", "acct-9")...),
				OnConflict: onReplace,
			}}},
		},
		{
			// rdkafka hashes the partition key and ignores the partition.
			name: "a partition key wins over a partition",
			rec:  schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_partition", "4", "schedule_target_partition_key", "acct-9")...),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out", Key: []byte("acct-9"), Payload: []byte("p"),
				Headers:    karafkaSourced("k", karafkaSchedule(nil, "schedule_target_partition", "4", "schedule_target_partition_key", "acct-9")...),
				OnConflict: onReplace,
			}}},
		},
		{
			// Karafka's merge replaces them; they come after the others here.
			name: "schedule_source_* headers on the proxy record are replaced",
			rec: schedRecord("k", []byte("p"), karafkaSchedule([]string{
				"schedule_source_topic", "elsewhere", "a", "1", "schedule_source_key", "x",
				"schedule_source_partition", "9", "schedule_source_offset", "1"})...),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out", Payload: []byte("p"),
				Headers:    karafkaSourced("k", karafkaSchedule([]string{"a", "1"})...),
				OnConflict: onReplace,
			}}},
		},
		{
			name: "companions",
			opts: DecodeOptions{HistoryTopic: "history", TombstoneBack: true},
			rec:  schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_partition", "0")...),
			want: Op{Events: []*chimev1.Event{
				{
					Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out", Partition: partitionOf(0), Payload: []byte("p"),
					Headers:    karafkaSourced("k", karafkaSchedule(nil, "schedule_target_partition", "0")...),
					OnConflict: onReplace,
				},
				{
					Id: "schedules/k#history", DeliverAt: unixAt(1700000000, 0), Topic: "history", Payload: []byte("p"),
					Headers:    karafkaSourced("k", karafkaSchedule(nil, "schedule_target_partition", "0")...),
					OnConflict: onReplace,
				},
				{
					Id: "schedules/k#tombstone-back", DeliverAt: unixAt(1700000000, 0), Topic: schedTopic, Key: []byte("k"),
					Partition: partitionOf(schedPartition), Tombstone: true,
					Headers:    withSource(eventHeaders(chimev1.HeaderTombstoneBack, "true")...),
					OnConflict: onReplace,
				},
			}},
		},
		{
			name: "Proxy.cancel",
			opts: DecodeOptions{IDFromKey: true, TombstoneBack: true},
			rec:  schedRecord("k", nil, cancel...),
			want: Op{Cancel: true, IDs: []string{"k", "k#tombstone-back"}},
		},
		{
			name: "a cancel with a value still cancels",
			rec:  schedRecord("k", []byte("x"), cancel...),
			want: Op{Cancel: true, IDs: []string{"schedules/k"}},
		},
		{
			name: "Karafka's own tombstone after a dispatch cancels",
			rec: schedRecord("k", nil, "schedule_schema_version", "1.0.0", "schedule_target_epoch", "1700000000",
				"schedule_source_type", "tombstone", "schedule_target_topic", "out", "schedule_source_offset", "41"),
			want: Op{Cancel: true, IDs: []string{"schedules/k"}},
		},
		{
			name: "Chime's tombstone back is skipped",
			rec:  schedRecord("k", nil, chimev1.HeaderTombstoneBack, "true"),
			want: Op{Skip: true},
		},

		{
			name:    "no key",
			rec:     schedRecord("", []byte("p"), karafkaSchedule(nil)...),
			wantErr: "key: required: the record key makes the event id", wantField: "key",
		},
		{
			name:    "no schema version",
			rec:     schedRecord("k", nil, "schedule_source_type", "cancel"),
			wantErr: "schedule_schema_version: required", wantField: "schedule_schema_version",
		},
		{
			name:    "a newer schema version",
			rec:     schedRecord("k", nil, "schedule_schema_version", "2.0.0", "schedule_source_type", "cancel"),
			wantErr: `schedule_schema_version: "2.0.0" is not a schema version Chime reads (1.0.0)`, wantField: "schedule_schema_version",
		},
		{
			name:    "a schema version not written as Karafka writes it",
			rec:     schedRecord("k", []byte("p"), "schedule_schema_version", "1.0", "schedule_source_type", "schedule"),
			wantErr: `schedule_schema_version: "1.0" is not a schema version Chime reads (1.0.0)`,
		},
		{
			name:    "no source type",
			rec:     schedRecord("k", []byte("p"), "schedule_schema_version", "1.0.0", "schedule_target_epoch", "1700000000", "schedule_target_topic", "out"),
			wantErr: "schedule_source_type: required", wantField: "schedule_source_type",
		},
		{
			name:    "an unknown source type",
			rec:     schedRecord("k", []byte("p"), "schedule_schema_version", "1.0.0", "schedule_source_type", "message"),
			wantErr: `schedule_source_type: "message" is not schedule, cancel or tombstone`,
		},
		{
			name:    "no epoch",
			rec:     schedRecord("k", []byte("p"), "schedule_schema_version", "1.0.0", "schedule_source_type", "schedule", "schedule_target_topic", "out"),
			wantErr: "schedule_target_epoch: required", wantField: "schedule_target_epoch",
		},
		{
			name: "epoch not a number",
			rec: schedRecord("k", []byte("p"), "schedule_schema_version", "1.0.0", "schedule_source_type", "schedule",
				"schedule_target_epoch", "2024-01-01", "schedule_target_topic", "out"),
			wantErr: `schedule_target_epoch: "2024-01-01" is not Unix seconds (a decimal integer)`,
		},
		{
			name: "no target topic",
			rec: schedRecord("k", []byte("p"), "schedule_schema_version", "1.0.0", "schedule_source_type", "schedule",
				"schedule_target_epoch", "1700000000"),
			wantErr: "schedule_target_topic: required", wantField: "schedule_target_topic",
		},
		{
			name:    "target topic twice",
			rec:     schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_topic", "")...),
			wantErr: "schedule_target_topic: set more than once",
		},
		{
			name: "empty target topic, once",
			rec: schedRecord("k", []byte("p"), "schedule_schema_version", "1.0.0", "schedule_source_type", "schedule",
				"schedule_target_epoch", "1700000000", "schedule_target_topic", ""),
			wantErr: "schedule_target_topic: required",
		},
		{
			name:    "negative partition",
			rec:     schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_partition", "-1")...),
			wantErr: `schedule_target_partition: "-1" is not a partition: a decimal integer from 0 to 2147483647`, wantField: "schedule_target_partition",
		},
		{
			name:    "partition not a number, even with a partition key",
			rec:     schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_partition", "two", "schedule_target_partition_key", "a")...),
			wantErr: `schedule_target_partition: "two" is not a partition: a decimal integer from 0 to 2147483647`,
		},
		{
			name:      "a partition key other than the key",
			rec:       schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_key", "user-1", "schedule_target_partition_key", "acct-9")...),
			wantErr:   `schedule_target_partition_key: "acct-9" differs from schedule_target_key "user-1": Chime places a record by its key, so it cannot place it by another (drop one of them, or set schedule_target_partition instead)`,
			wantField: "schedule_target_partition_key",
		},
		{
			name:      "a chime-* header is not copied",
			rec:       schedRecord("k", []byte("p"), karafkaSchedule([]string{"chime-delay", "1s"})...),
			wantErr:   `chime-delay: the "chime-" prefix is reserved for headers Chime adds`,
			wantField: "chime-delay",
		},
		{
			name:    "a control header twice",
			rec:     schedRecord("k", []byte("p"), karafkaSchedule(nil, "schedule_target_epoch", "1800000000")...),
			wantErr: "schedule_target_epoch: set more than once",
		},
	})
}
