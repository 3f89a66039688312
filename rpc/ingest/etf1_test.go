package ingest

import (
	"testing"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

func TestETF1Format(t *testing.T) {
	runDecodeCases(t, "etf1", []decodeCase{
		{
			// The example of etf1's README: the fired record carries the
			// schedule's headers, then scheduler-key and scheduler-topic.
			name: "README example",
			opts: DecodeOptions{IDFromKey: true},
			rec: schedRecord("vid1-online", []byte("video 1"),
				"scheduler-epoch", "1893456000",
				"scheduler-target-topic", "online-videos",
				"scheduler-target-key", "vid1",
				"customer-header", "dummy"),
			want: Op{Events: []*chimev1.Event{{
				Id: "vid1-online", DeliverAt: unixAt(1893456000, 0), Topic: "online-videos",
				Key: []byte("vid1"), Payload: []byte("video 1"),
				Headers: withSource(eventHeaders(
					"scheduler-epoch", "1893456000",
					"scheduler-target-topic", "online-videos",
					"scheduler-target-key", "vid1",
					"customer-header", "dummy",
					"scheduler-timestamp", schedTimestamp,
					"scheduler-key", "vid1-online",
					"scheduler-topic", "schedules")...),
				OnConflict: onReplace,
			}}},
		},
		{
			name: "no target key: no key; empty value; id from the topic",
			rec:  schedRecord("s1", []byte{}, "scheduler-target-topic", "out", "scheduler-epoch", "0"),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/s1", DeliverAt: unixAt(0, 0), Topic: "out",
				Headers: withSource(eventHeaders(
					"scheduler-target-topic", "out",
					"scheduler-epoch", "0",
					"scheduler-timestamp", schedTimestamp,
					"scheduler-key", "s1",
					"scheduler-topic", "schedules")...),
				OnConflict: onReplace,
			}}},
		},
		{
			// etf1 reads the first of a repeated header, and copies them
			// all, its own scheduler-key included.
			name: "repeated headers: the first is read, all are copied",
			rec: schedRecord("s1", []byte("v"),
				"scheduler-epoch", "1700000000",
				"scheduler-epoch", "1800000000",
				"scheduler-target-topic", "out",
				"scheduler-target-topic", "other",
				"scheduler-target-key", "a",
				"scheduler-target-key", "b",
				"scheduler-key", "old"),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/s1", DeliverAt: unixAt(1700000000, 0), Topic: "out",
				Key: []byte("a"), Payload: []byte("v"),
				Headers: withSource(eventHeaders(
					"scheduler-epoch", "1700000000",
					"scheduler-epoch", "1800000000",
					"scheduler-target-topic", "out",
					"scheduler-target-topic", "other",
					"scheduler-target-key", "a",
					"scheduler-target-key", "b",
					"scheduler-key", "old",
					"scheduler-timestamp", schedTimestamp,
					"scheduler-key", "s1",
					"scheduler-topic", "schedules")...),
				OnConflict: onReplace,
			}}},
		},
		{
			name: "a negative epoch is a time before 1970",
			rec:  schedRecord("s1", []byte("v"), "scheduler-epoch", "-5", "scheduler-target-topic", "out"),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/s1", DeliverAt: unixAt(-5, 0), Topic: "out", Payload: []byte("v"),
				Headers: withSource(eventHeaders(
					"scheduler-epoch", "-5",
					"scheduler-target-topic", "out",
					"scheduler-timestamp", schedTimestamp,
					"scheduler-key", "s1",
					"scheduler-topic", "schedules")...),
				OnConflict: onReplace,
			}}},
		},
		{
			name: "history copy and tombstone back, as etf1 produces them",
			opts: DecodeOptions{HistoryTopic: "history", TombstoneBack: true},
			rec:  schedRecord("s1", []byte("v"), "scheduler-epoch", "1700000000", "scheduler-target-topic", "out", "scheduler-target-key", "tk"),
			want: Op{Events: []*chimev1.Event{
				{
					Id: "schedules/s1", DeliverAt: unixAt(1700000000, 0), Topic: "out", Key: []byte("tk"), Payload: []byte("v"),
					Headers: withSource(eventHeaders(
						"scheduler-epoch", "1700000000", "scheduler-target-topic", "out", "scheduler-target-key", "tk",
						"scheduler-timestamp", schedTimestamp,
						"scheduler-key", "s1", "scheduler-topic", "schedules")...),
					OnConflict: onReplace,
				},
				{
					Id: "schedules/s1#history", DeliverAt: unixAt(1700000000, 0), Topic: "history", Key: []byte("tk"), Payload: []byte("v"),
					Headers: withSource(eventHeaders(
						"scheduler-epoch", "1700000000", "scheduler-target-topic", "out", "scheduler-target-key", "tk",
						"scheduler-timestamp", schedTimestamp,
						"scheduler-key", "s1", "scheduler-topic", "schedules")...),
					OnConflict: onReplace,
				},
				{
					Id: "schedules/s1#tombstone-back", DeliverAt: unixAt(1700000000, 0), Topic: schedTopic, Key: []byte("s1"),
					Partition: partitionOf(schedPartition), Tombstone: true,
					Headers:    withSource(eventHeaders(chimev1.HeaderTombstoneBack, "true")...),
					OnConflict: onReplace,
				},
			}},
		},
		{
			name: "a tombstone cancels (a user's, or etf1's own after it fired)",
			opts: DecodeOptions{HistoryTopic: "history"},
			rec:  schedRecord("s1", nil, "scheduler-key", "s1", "scheduler-topic", "schedules"),
			want: Op{Cancel: true, IDs: []string{"schedules/s1", "schedules/s1#history"}},
		},
		{
			name: "Chime's tombstone back is skipped",
			rec:  schedRecord("s1", nil, chimev1.HeaderTombstoneBack, "true"),
			want: Op{Skip: true},
		},

		{
			name:    "no key",
			rec:     schedRecord("", []byte("v"), "scheduler-epoch", "1700000000", "scheduler-target-topic", "out"),
			wantErr: "key: required: the record key makes the event id", wantField: "key",
		},
		{
			name:    "no epoch",
			rec:     schedRecord("s1", []byte("v"), "scheduler-target-topic", "out"),
			wantErr: "scheduler-epoch: required", wantField: "scheduler-epoch",
		},
		{
			name:    "empty epoch",
			rec:     schedRecord("s1", []byte("v"), "scheduler-epoch", "", "scheduler-target-topic", "out"),
			wantErr: "scheduler-epoch: required",
		},
		{
			name:    "epoch not a number",
			rec:     schedRecord("s1", []byte("v"), "scheduler-epoch", "tomorrow", "scheduler-target-topic", "out"),
			wantErr: `scheduler-epoch: "tomorrow" is not Unix seconds (a decimal integer)`, wantField: "scheduler-epoch",
		},
		{
			name:    "epoch with a fraction",
			rec:     schedRecord("s1", []byte("v"), "scheduler-epoch", "1700000000.5", "scheduler-target-topic", "out"),
			wantErr: `scheduler-epoch: "1700000000.5" is not Unix seconds (a decimal integer)`,
		},
		{
			name:    "epoch in milliseconds beyond int64",
			rec:     schedRecord("s1", []byte("v"), "scheduler-epoch", "99999999999999999999", "scheduler-target-topic", "out"),
			wantErr: `scheduler-epoch: "99999999999999999999" is not Unix seconds (a decimal integer)`,
		},
		{
			name:    "no target topic",
			rec:     schedRecord("s1", []byte("v"), "scheduler-epoch", "1700000000", "scheduler-target-key", "k"),
			wantErr: "scheduler-target-topic: required", wantField: "scheduler-target-topic",
		},
		{
			name:    "a chime-* header is not copied",
			rec:     schedRecord("s1", []byte("v"), "scheduler-epoch", "1700000000", "scheduler-target-topic", "out", "Chime-Id", "x"),
			wantErr: `Chime-Id: the "chime-" prefix is reserved for headers Chime adds`, wantField: "Chime-Id",
		},
		{
			name:    "empty target topic",
			rec:     schedRecord("s1", []byte("v"), "scheduler-target-topic", "", "scheduler-epoch", "1700000000"),
			wantErr: "scheduler-target-topic: required",
		},
	})
}
