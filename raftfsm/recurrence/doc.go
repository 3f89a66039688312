// Package recurrence computes when a recurring schedule's rule occurs: the
// instants a cron expression or a fixed interval generates in an IANA time
// zone, between an optional start and end, and the jitter each occurrence
// is delayed by.
//
// # What it owns
//
//   - Parsing and checking a rule (Parse). Cron expressions are parsed by
//     github.com/robfig/cron/v3: five fields, an optional leading seconds
//     field, and the descriptors (@hourly, @daily, ...). "@every D" is read
//     here as a fixed interval anchored at the rule's start, as the every
//     rule is, rather than as cron/v3's "D after whatever time you ask
//     about", which would drift with the times it is asked at.
//   - The meaning of a wall-clock rule across time-zone transitions (see
//     below). cron/v3 matches the fields against wall-clock (civil) time,
//     which is what a rule means; mapping a matching civil time to an
//     instant is this package's own, because cron/v3 skips a civil time a
//     spring-forward gap removes and fires one a fall-back repeats twice, and a
//     scheduler that skips a daily payment run once a year is wrong.
//   - The zone database. Go's time.LoadLocation prefers the host's
//     zoneinfo over the one time/tzdata embeds, so two replicas on hosts
//     with different tz releases would derive different instants from one
//     rule, and a replicated state machine must not. This package reads
//     zones only from its own embedded copy of the IANA database
//     (zoneinfo.zip, tzdata 2025c, copied from the Go toolchain by
//     go generate), so every replica of one build computes the same instants
//     on any host, and a container without zoneinfo works.
//   - Jitter: an occurrence's delay in [0, jitter), a hash of the schedule
//     id and the occurrence, the same on every replica.
//
// # Transitions
//
// A civil time that exists once occurs at that instant. A civil time
// skipped by a forward transition (the gap) occurs at the first instant
// after the gap, the transition itself, and all matching civil times of
// one gap occur there once. A civil time repeated by a backward transition
// (the overlap) occurs at its first instant only. An every rule is a fixed
// number of nanoseconds and ignores the zone.
//
// # What it must never do
//
// It reads no clock, draws no randomness, does no I/O but reading its
// embedded database, and starts no goroutine: the state machine calls it
// while applying a log entry, and every replica must get the same answer.
// Times arrive as arguments.
//
// # Invariants
//
//  1. Next is strictly increasing: Next(t) > t, and iterating Next from any
//     instant yields every occurrence in [Start, End] once, in order
//     (TestDSTTransitions, TestOccurrencesMatchStepByStep).
//  2. An occurrence is never before Start nor after End.
//  3. Latest(t) is the last occurrence at or before t, and Next of the
//     instant before it is it (TestLatest).
package recurrence
