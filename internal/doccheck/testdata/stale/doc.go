// Package stale is the checker's test: its doc names declarations that
// exist and, after a rename nobody carried into the prose, some that do not.
//
// Names that resolve: Engine.Start and [Engine.Start], the loop
// (horizonLoop) it starts, Tuning.WheelHorizon, defaultTuning.WheelHorizon,
// the field of the embedded type Tuning.Promoted, Engine.tuning.WheelHorizon
// through a field, Engine.lease.mu, lease.renew, a loop's variable
// (pending), [Open], other.Thing, [other.Thing], stale.Open and an exported
// name of another package alone (Thing, ThingDone).
//
// Words that are not names of this module: Raft, Pebble, Kafka, gRPC, 64 MiB,
// e.g. a version v1.7.3, a file engine.go or tuning.json, a path
// cmd/chimed/node, a flag --wheel-horizon, context.Context, errors.Is,
// a host a.example, JSON keys like stale_reads, codes like NOT_FOUND.
//
// Names that do not: Engine.Stop, [Engine.Run], the old loop (horizonLoopV1),
// Tuning.Horizon, defaultTuning.Horizon, Engine.tuning.Horizon, lease.extend,
// Flush(), `drain`, [Close], other.Gone, Tuning_Value, and OtherThing.
//
// A code block is not read:
//
//	e := Open()
//	e.MissingInCode()
package stale
