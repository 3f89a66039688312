package main

import (
	"flag"
	"slices"
	"strings"

	"github.com/chimehq/chime/rpc"
)

// registerTopicFlags registers --reserved-topics and --allow-topic, which
// say what topics an event may target: chimed serve and dev check each
// event a client schedules with them, and chimed restore each event and
// recurring schedule of a backup, so that a backup cannot bring in what the
// API refuses. reserved stays nil unless --reserved-topics is given.
func registerTopicFlags(fs *flag.FlagSet, reserved, allow *[]string) {
	fs.Func("reserved-topics", "comma-separated topic `patterns` (path.Match: * ? [a-z]) no event may target, besides the\ndead-letter topic (default \""+strings.Join(rpc.DefaultReservedTopics, ",")+"\": Kafka's internal topics, the Schema\nRegistry's, Kafka Connect's and Chime's own). Names starting with \"__\" are always reserved", func(v string) error {
		*reserved = strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' })
		return nil
	})
	fs.Func("allow-topic", "let events target this reserved `topic` (Kafka's internal topics, named \"__...\", and the\ndead-letter topic are refused otherwise); repeatable", func(v string) error {
		*allow = append(*allow, v)
		return nil
	})
}

// setTopicLimits gives lim the reserved topics of the flags: --reserved-topics
// (rpc.DefaultReservedTopics when reserved is nil), Chime's own topics (the
// dead-letter topic, and the ingest's rejected topic when ingest is on),
// and the --allow-topic exceptions. lim.Validate checks the patterns.
func setTopicLimits(lim *rpc.Limits, reserved []string, allow []string, own ...string) {
	if reserved == nil {
		reserved = rpc.DefaultReservedTopics
	}
	lim.ReservedTopics = append(slices.Clone(reserved), own...)
	lim.AllowTopics = allow
}
