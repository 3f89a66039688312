package ingest

import (
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

const (
	onReplace = chimev1.OnConflict_ON_CONFLICT_REPLACE
	onReject  = chimev1.OnConflict_ON_CONFLICT_REJECT
)

func TestChimeFormat(t *testing.T) {
	const unknown = `not a header of Chime's format; the "chime-" prefix is reserved (chime-deliver-at, chime-delay, chime-topic, chime-key, chime-partition, chime-priority, chime-window, chime-on-conflict, chime-deliver-tombstone)`
	due := []string{HeaderDeliverAt, "1700000000000", HeaderTargetTopic, "out"}
	with := func(hs ...string) []string { return append(append([]string{}, due...), hs...) }
	runDecodeCases(t, "chime", []decodeCase{
		{
			name: "deliver-at in Unix milliseconds",
			rec:  schedRecord("k", []byte("v"), HeaderDeliverAt, "1700000000250", HeaderTargetTopic, "out"),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 250000000), Topic: "out",
				Key: []byte("k"), Payload: []byte("v"), Headers: withSource(), OnConflict: onReplace,
			}}},
		},
		{
			name: "deliver-at in RFC 3339, id from the key",
			opts: DecodeOptions{IDFromKey: true},
			rec:  schedRecord("k", []byte("v"), HeaderDeliverAt, "2026-11-28T18:00:00.5Z", HeaderTargetTopic, "out"),
			want: Op{Events: []*chimev1.Event{{
				Id: "k", DeliverAt: unixAt(1795888800, 500000000), Topic: "out",
				Key: []byte("k"), Payload: []byte("v"), Headers: withSource(), OnConflict: onReplace,
			}}},
		},
		{
			name: "delay, empty value",
			rec:  schedRecord("k", []byte{}, HeaderDelay, "1h30m", HeaderTargetTopic, "out"),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", Delay: &durationpb.Duration{Seconds: 5400}, Topic: "out",
				Key: []byte("k"), Headers: withSource(), OnConflict: onReplace,
			}}},
		},
		{
			name: "every header, copied headers kept in order",
			rec: schedRecord("k", []byte("v"),
				"trace", "t1",
				HeaderTargetTopic, "out",
				HeaderTargetKey, "user-7",
				"dup", "1",
				HeaderTargetPartition, "7",
				HeaderPriority, "9",
				HeaderWindow, "10m",
				HeaderOnConflict, "reject",
				HeaderDeliverTombstone, "false",
				"dup", "2",
				HeaderDelay, "0s",
				"empty", ""),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", Delay: &durationpb.Duration{}, Topic: "out",
				Key: []byte("user-7"), Partition: partitionOf(7), Payload: []byte("v"),
				Headers:    withSource(eventHeaders("trace", "t1", "dup", "1", "dup", "2", "empty", "")...),
				OnConflict: onReject, Priority: priorityOf(9), Window: &durationpb.Duration{Seconds: 600},
			}}},
		},
		{
			name: "chime-on-conflict replace, chime-key empty: no key",
			rec:  schedRecord("k", []byte("v"), with(HeaderOnConflict, "replace", HeaderTargetKey, "", HeaderPriority, "0", HeaderTargetPartition, "0")...),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out", Partition: partitionOf(0),
				Payload: []byte("v"), Headers: withSource(), OnConflict: onReplace, Priority: priorityOf(0),
			}}},
		},
		{
			name: "deliver a tombstone",
			rec:  schedRecord("k", []byte{}, with(HeaderDeliverTombstone, "true")...),
			want: Op{Events: []*chimev1.Event{{
				Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out",
				Key: []byte("k"), Tombstone: true, Headers: withSource(), OnConflict: onReplace,
			}}},
		},
		{
			name: "companions follow the event's policy and conflict rule",
			opts: DecodeOptions{HistoryTopic: "history", TombstoneBack: true},
			rec:  schedRecord("k", []byte("v"), with("h", "1", HeaderPriority, "2", HeaderWindow, "1s", HeaderOnConflict, "reject", HeaderTargetKey, "tk")...),
			want: Op{Events: []*chimev1.Event{
				{
					Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out", Key: []byte("tk"), Payload: []byte("v"),
					Headers: withSource(eventHeaders("h", "1")...), OnConflict: onReject, Priority: priorityOf(2), Window: &durationpb.Duration{Seconds: 1},
				},
				{
					Id: "schedules/k#history", DeliverAt: unixAt(1700000000, 0), Topic: "history", Key: []byte("tk"), Payload: []byte("v"),
					Headers: withSource(eventHeaders("h", "1")...), OnConflict: onReject, Priority: priorityOf(2), Window: &durationpb.Duration{Seconds: 1},
				},
				{
					Id: "schedules/k#tombstone-back", DeliverAt: unixAt(1700000000, 0), Topic: schedTopic, Key: []byte("k"),
					Partition: partitionOf(schedPartition), Tombstone: true,
					Headers:    withSource(eventHeaders(chimev1.HeaderTombstoneBack, "true")...),
					OnConflict: onReject, Priority: priorityOf(2), Window: &durationpb.Duration{Seconds: 1},
				},
			}},
		},
		{
			name: "a tombstone delivered, with its history copy",
			opts: DecodeOptions{HistoryTopic: "history"},
			rec:  schedRecord("k", []byte{}, with(HeaderDeliverTombstone, "true")...),
			want: Op{Events: []*chimev1.Event{
				{
					Id: "schedules/k", DeliverAt: unixAt(1700000000, 0), Topic: "out",
					Key: []byte("k"), Tombstone: true, Headers: withSource(), OnConflict: onReplace,
				},
				{
					Id: "schedules/k#history", DeliverAt: unixAt(1700000000, 0), Topic: "history",
					Key: []byte("k"), Tombstone: true, Headers: withSource(), OnConflict: onReplace,
				},
			}},
		},
		{
			name: "a tombstone cancels, whatever its headers",
			rec:  schedRecord("k", nil, HeaderDeliverAt, "tomorrow", "chime-delivr-at", "x"),
			want: Op{Cancel: true, IDs: []string{"schedules/k"}},
		},
		{
			name: "Chime's tombstone back is skipped",
			opts: DecodeOptions{TombstoneBack: true},
			rec:  schedRecord("k", nil, chimev1.HeaderTombstoneBack, "true"),
			want: Op{Skip: true},
		},

		{name: "no key", rec: schedRecord("", []byte("v"), due...), wantErr: "key: required: the record key makes the event id", wantField: "key"},
		{
			name:    "neither deliver-at nor delay",
			rec:     schedRecord("k", []byte("v"), HeaderTargetTopic, "out"),
			wantErr: "chime-deliver-at: set exactly one of chime-deliver-at and chime-delay (neither is set)", wantField: HeaderDeliverAt,
		},
		{
			name:    "both deliver-at and delay",
			rec:     schedRecord("k", []byte("v"), with(HeaderDelay, "1s")...),
			wantErr: "chime-delay: set exactly one of chime-deliver-at and chime-delay (both are set)", wantField: HeaderDelay,
		},
		{
			name:    "deliver-at neither form",
			rec:     schedRecord("k", []byte("v"), HeaderDeliverAt, "tomorrow", HeaderTargetTopic, "out"),
			wantErr: `chime-deliver-at: "tomorrow" is neither RFC 3339 nor Unix milliseconds`, wantField: HeaderDeliverAt,
		},
		{
			name:    "deliver-at in Unix seconds",
			rec:     schedRecord("k", []byte("v"), HeaderDeliverAt, "1700000000", HeaderTargetTopic, "out"),
			wantErr: `chime-deliver-at: "1700000000" is Unix milliseconds before 1973-03-03, Unix seconds by mistake? (1700000000000 in milliseconds)`,
		},
		{
			name:    "deliver-at without a zone",
			rec:     schedRecord("k", []byte("v"), HeaderDeliverAt, "2026-11-28T18:00:00", HeaderTargetTopic, "out"),
			wantErr: `chime-deliver-at: "2026-11-28T18:00:00" is neither RFC 3339 nor Unix milliseconds`,
		},
		{
			name:    "deliver-at empty",
			rec:     schedRecord("k", []byte("v"), HeaderDeliverAt, "", HeaderTargetTopic, "out"),
			wantErr: `chime-deliver-at: "" is neither RFC 3339 nor Unix milliseconds`,
		},
		{
			name:    "delay not a Go duration",
			rec:     schedRecord("k", []byte("v"), HeaderDelay, "5 minutes", HeaderTargetTopic, "out"),
			wantErr: `chime-delay: "5 minutes" is not a Go duration (such as 90s or 1h30m)`, wantField: HeaderDelay,
		},
		{
			name:    "no topic",
			rec:     schedRecord("k", []byte("v"), HeaderDeliverAt, "1700000000000"),
			wantErr: "chime-topic: required", wantField: HeaderTargetTopic,
		},
		{
			name:    "empty topic",
			rec:     schedRecord("k", []byte("v"), HeaderDeliverAt, "1700000000000", HeaderTargetTopic, ""),
			wantErr: "chime-topic: required",
		},
		{
			name:    "negative partition",
			rec:     schedRecord("k", []byte("v"), with(HeaderTargetPartition, "-1")...),
			wantErr: `chime-partition: "-1" is not a partition: a decimal integer from 0 to 2147483647`, wantField: HeaderTargetPartition,
		},
		{
			name:    "partition beyond int32",
			rec:     schedRecord("k", []byte("v"), with(HeaderTargetPartition, "2147483648")...),
			wantErr: `chime-partition: "2147483648" is not a partition: a decimal integer from 0 to 2147483647`,
		},
		{
			name:    "partition not a number",
			rec:     schedRecord("k", []byte("v"), with(HeaderTargetPartition, "p1")...),
			wantErr: `chime-partition: "p1" is not a partition: a decimal integer from 0 to 2147483647`,
		},
		{
			name:    "priority 10",
			rec:     schedRecord("k", []byte("v"), with(HeaderPriority, "10")...),
			wantErr: `chime-priority: "10" is not a priority: one digit, 0 (lowest) to 9 (highest)`, wantField: HeaderPriority,
		},
		{
			name:    "priority empty",
			rec:     schedRecord("k", []byte("v"), with(HeaderPriority, "")...),
			wantErr: `chime-priority: "" is not a priority: one digit, 0 (lowest) to 9 (highest)`,
		},
		{
			name:    "window not a Go duration",
			rec:     schedRecord("k", []byte("v"), with(HeaderWindow, "soon")...),
			wantErr: `chime-window: "soon" is not a Go duration (such as 90s or 1h30m)`, wantField: HeaderWindow,
		},
		{
			name:    "on-conflict unknown",
			rec:     schedRecord("k", []byte("v"), with(HeaderOnConflict, "upsert")...),
			wantErr: `chime-on-conflict: "upsert" is neither replace nor reject`, wantField: HeaderOnConflict,
		},
		{
			name:    "on-conflict in capitals",
			rec:     schedRecord("k", []byte("v"), with(HeaderOnConflict, "REPLACE")...),
			wantErr: `chime-on-conflict: "REPLACE" is neither replace nor reject`,
		},
		{
			name:    "deliver-tombstone not a boolean",
			rec:     schedRecord("k", []byte{}, with(HeaderDeliverTombstone, "yes")...),
			wantErr: `chime-deliver-tombstone: "yes" is neither true nor false`, wantField: HeaderDeliverTombstone,
		},
		{
			name:    "deliver-tombstone with a value",
			rec:     schedRecord("k", []byte("abc"), with(HeaderDeliverTombstone, "true")...),
			wantErr: "chime-deliver-tombstone: a tombstone has no value, and the record's is 3 bytes (send an empty one)",
		},
		{
			name:    "a typo is not copied",
			rec:     schedRecord("k", []byte("v"), with("chime-delivr-at", "1700000000000")...),
			wantErr: "chime-delivr-at: " + unknown, wantField: "chime-delivr-at",
		},
		{
			name:    "the prefix in any case",
			rec:     schedRecord("k", []byte("v"), with("Chime-Deliver-At", "1700000000000")...),
			wantErr: "Chime-Deliver-At: " + unknown, wantField: "Chime-Deliver-At",
		},
		{
			name:    "Chime's own output headers are not input",
			rec:     schedRecord("k", []byte("v"), with(chimev1.HeaderID, "x")...),
			wantErr: "chime-id: " + unknown,
		},
		{
			name:    "chime-tombstone-back on a record with a value",
			rec:     schedRecord("k", []byte("v"), with(chimev1.HeaderTombstoneBack, "true")...),
			wantErr: "chime-tombstone-back: " + unknown,
		},
		{
			name:    "a header set twice",
			rec:     schedRecord("k", []byte("v"), with(HeaderTargetTopic, "other")...),
			wantErr: "chime-topic: set more than once", wantField: HeaderTargetTopic,
		},
		{
			name:    "headers are checked in order, before what is missing",
			rec:     schedRecord("k", []byte("v"), HeaderPriority, "x", "chime-nope", ""),
			wantErr: `chime-priority: "x" is not a priority: one digit, 0 (lowest) to 9 (highest)`,
		},
	})
}
