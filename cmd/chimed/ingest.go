package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/chimehq/chime/rpc/ingest"
)

// ingestFlags are the --ingest-* flags.
type ingestFlags struct {
	topics, format, group, rejected  string
	history, registry                string
	tombstoneBack, idFromKey, dryRun bool
}

func registerIngestFlags(fs *flag.FlagSet, cmd string) *ingestFlags {
	f := &ingestFlags{}
	def, when := "", "off unless given"
	if cmd == "dev" {
		def, when = "chime.schedule", "on in dev: produce to chime.schedule to schedule"
	}
	fs.StringVar(&f.topics, "ingest-topics", def, "comma-separated `topics` to schedule from by producing records ("+when+"). Every node joins\n"+
		"the --ingest-group consumer group and applies its share of the partitions through its own API;\n"+
		"a partition's offset is committed only once Raft committed its records. A topic takes\n"+
		"--ingest-format, or its own as topic=format (chime.schedule,schedules=etf1). Empty: off")
	fs.StringVar(&f.format, "ingest-format", "chime", "the record contract of the --ingest-topics that name none: chime (headers chime-deliver-at or\n"+
		"chime-delay, chime-topic, ...; the record key is the id, a tombstone cancels), or the contract\n"+
		"of the scheduler Chime replaces: etf1, karafka or sky (docs/ingest.md)")
	fs.StringVar(&f.group, "ingest-group", ingest.DefaultGroup, "the Kafka consumer `group` of the ingest consumers; every node of a cluster must give the same")
	fs.StringVar(&f.rejected, "ingest-rejected-topic", ingest.DefaultRejectedTopic, "`topic` that receives the records that cannot be applied (no key, a bad header, an invalid\n"+
		"event), with their key, value and headers plus chime-error (the field and the rule) and\n"+
		"chime-source (topic/partition/offset); the records after one go on")
	fs.StringVar(&f.history, "ingest-history-topic", "", "`topic` to also produce a copy of each fired record to, at its due time (etf1's history topic)")
	fs.BoolVar(&f.tombstoneBack, "ingest-tombstone-back", false, "after a record's event is due, produce a tombstone with its key back to the topic it came from,\n"+
		"as the scheduler Chime replaces did: a compacted schedules topic forgets fired schedules,\n"+
		"and a rollback to that scheduler stays possible")
	fs.BoolVar(&f.idFromKey, "ingest-id-from-key", false, "take the record key as the event id as it is; without it the id is <topic>/<key>, so that two\n"+
		"ingest topics cannot collide")
	fs.BoolVar(&f.dryRun, "ingest-dry-run", false, "decode and validate every record of --ingest-topics, and schedule and cancel nothing: a check of\n"+
		"a topic another scheduler still serves. Records Chime would refuse go to --ingest-rejected-topic\n"+
		"with chime-error; chime_ingest_topic_records_total{result=\"dry_run\"} counts the others. Give it\n"+
		"its own --ingest-group, so the offsets it commits are not those of a real ingest")
	fs.StringVar(&f.registry, "ingest-schema-registry", "", "`URL` of a Confluent schema registry for sky's Avro records in the registry's wire format\n"+
		"(without it, the schemas sky publishes, committed with Chime)")
	return f
}

// sources are the ingest topics the flags name, each with its format and
// options; none when --ingest-topics is empty.
func (f *ingestFlags) sources() ([]ingest.Source, error) {
	var out []ingest.Source
	for _, t := range strings.Split(f.topics, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			continue
		}
		topic, format, named := strings.Cut(t, "=")
		if !named {
			format = f.format
		}
		if topic == "" {
			return nil, fmt.Errorf("--ingest-topics %q: %q names no topic", f.topics, t)
		}
		out = append(out, ingest.Source{Topic: topic, Format: format, DecodeOptions: ingest.DecodeOptions{
			IDFromKey: f.idFromKey, HistoryTopic: f.history, TombstoneBack: f.tombstoneBack, SchemaRegistry: f.registry,
		}})
	}
	return out, nil
}
