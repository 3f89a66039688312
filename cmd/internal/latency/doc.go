// Package latency summarises and draws measured latencies for Chime's
// commands: chime-jepsen's checker (lateness and client latency in
// report.html and results.json) and chimectl bench (its summary and its
// timeline SVG). It exists so that the two report the same quantile and
// draw the same plot, and so that chimectl, a client, does not link the
// fault checker.
//
// # What it owns
//
//   - [Quantile]: nearest rank (the value at rank ⌈q·n⌉ of the n sorted
//     values), the project's one definition of p50, p99 and max.
//   - The SVG plotter: [Plot] (series of dots or lines over seconds, on a
//     symlog millisecond axis, sign(y)·log10(1+|y|), or a linear one from
//     0), [Band] (shaded spans such as fault windows), [Render] for one
//     plot element and [StackSVG] for a standalone document. A plot draws at
//     most [MaxPoints] dots and says in its legend how many it left out;
//     every text from the caller is escaped.
//
// # What it must never do
//
// It is pure: no I/O, no clock, no randomness; output is a function of the
// input. It links none of Chime's server packages (shard, raftfsm, rpc,
// publish) nor a Kafka client, since chimectl imports it.
package latency
