// Package wheel is a hierarchical timing wheel (Varghese & Lauck, scheme 7):
// the in-memory index of every pending event of a shard replica, from which
// the shard leader learns what has fallen due.
//
// # What it owns and what it must never do
//
// A Wheel holds, for each pending entry, a caller-chosen 64-bit reference (in
// Chime, the event's per-shard sequence number), its due time in Unix
// nanoseconds and a priority (0 to 15). Payloads and anything else live with
// the caller.
//
// The wheel is a pure data structure. It starts no goroutine, reads no clock,
// takes no lock and does no I/O: its owner passes the current time to
// [Wheel.Advance] and serialises all calls. This keeps it deterministic and
// testable against a reference model, and it lets the owner decide how to
// sleep ([Wheel.NextDue] says until when).
//
// # Layout
//
// Time is cut into ticks of a fixed resolution (default 1 ms, as Kafka's
// purgatory wheel uses). An entry belongs to tick ceil(due/resolution): the
// first tick boundary at or after its due time. There are 11 levels of 64
// slots; a slot at level L spans 64^L ticks, so the levels cover the whole
// int64 range and no due time needs a special case. An entry sits at the
// level of the highest 6-bit digit in which its tick differs from the wheel's
// current tick, so every entry at level L is due before every entry at level
// L+1. A 64-bit occupancy mask per level finds the next non-empty slot with a
// single bit scan: advancing across an hour (or a year) of empty time costs a
// few operations per non-empty slot, never one per empty slot. When time
// reaches a slot above level 0, its entries cascade to lower levels; an entry
// moves at most once per level.
//
// [Wheel.Advance] returns what fell due in due order. [Wheel.Ready] is for an
// owner that is behind, with more due than it takes at once: it moves every
// entry due by now onto one list per priority and returns the highest
// priorities first, up to a limit; the rest stay on those lists (still
// entries of the wheel, with valid handles) for the next call. Each entry
// moves there once, so a backlog costs no more than draining it.
//
// Entries live in slabs of fixed-size, pointer-free structs linked by int32
// indices (32 bytes each; no allocation per entry and nothing for the garbage
// collector to scan). Freed entries are reused through a free list. A [Handle]
// carries the slot index and a generation number, so a handle to an entry that
// was returned or removed is recognised as stale.
//
// # Invariants
//
//   - Never early: Advance(now) returns an entry only if its due time is at
//     or before now.
//   - At most one tick late: an entry is returned by the first Advance whose
//     now reaches the tick boundary at or after its due time. An owner that
//     advances as soon as NextDue says therefore sees each entry at most one
//     resolution after its due time (plus its own scheduling delay).
//   - Each entry is returned exactly once, unless it was removed first.
//     Removing it after it was returned, or twice, is a no-op that reports
//     false.
//   - An entry added with a due time at or before the wheel's current tick is
//     returned by the next Advance.
//   - Advance returns entries in non-decreasing due order, including across
//     the ticks of one call, after those a Ready found due and left.
//   - Ready never returns an entry while one of a higher priority that is
//     due by the same time is left in the wheel.
//   - Time never moves backwards: Advance to an earlier time returns nothing
//     and changes nothing.
package wheel
