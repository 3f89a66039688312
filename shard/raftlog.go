package shard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// raftLogger is the hclog.Logger the shard hands hashicorp/raft, its
// network transport, its snapshot store and raft-wal: it writes their lines
// to the shard's *slog.Logger, so they carry the shard's attributes, go
// where the node's other lines go, and are kept or dropped by the level of
// the node's slog handler. It is hand-written: go-hclog (v1.6.2, and v1.6.3,
// its latest release) has no slog backend, and no maintained library
// provides one; what raft calls is the leveled methods, With and Named.
//
// The logger's name ("raft", "raft.wal") is the record's component
// attribute, as the node names its other parts.
type raftLogger struct {
	base    *slog.Logger // the shard's logger and the With arguments
	l       *slog.Logger // base with the component
	name    string
	implied []any
}

func newRaftLogger(l *slog.Logger) *raftLogger { return newRaftLoggerNamed(l, nil, "raft") }

func newRaftLoggerNamed(base *slog.Logger, implied []any, name string) *raftLogger {
	return &raftLogger{base: base, l: base.With("component", name), name: name, implied: implied}
}

// slogLevel maps an hclog level onto slog's: WARN and ERROR as they are,
// raft's INFO at DEBUG, and its DEBUG and TRACE four and eight below. raft's
// INFO lines are its routine (every snapshot taken, every log compaction,
// every state change, about 2.5 lines a second per shard under load): at the
// node's default level they would bury its own lines. The normal courses of
// events raft logs as warnings (level) are what a node's INFO shows of raft.
// ok is false for Off.
func slogLevel(l hclog.Level) (lvl slog.Level, ok bool) {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 8, true
	case hclog.Debug:
		return slog.LevelDebug - 4, true
	case hclog.Warn:
		return slog.LevelWarn, true
	case hclog.Error:
		return slog.LevelError, true
	case hclog.Off:
		return 0, false
	}
	return slog.LevelDebug, true // Info, and NoLevel
}

// electionNoLeader is the line raft logs at WARN when a follower's heartbeat
// timeout passes and it stands for election.
const electionNoLeader = "heartbeat timeout reached, starting election"

// noPeers is the line raft logs at WARN when a replica whose configuration
// names no server at all reaches its heartbeat timeout.
const noPeers = "no known peers, aborting election"

// level is the slog level of one of raft's lines. raft logs some normal
// courses of events at WARN or ERROR; those are logged lower, told apart
// from the trouble the same message reports otherwise by its arguments:
//   - The start of an election with no leader known (last-leader-addr
//     empty), at INFO: a replica that has just started knows of none, so
//     every shard's first election on every start of a node begins with it.
//     After a leader, it means the leader went quiet, and stays WARN.
//   - A follower with an empty log (last-index 0) told of entries before
//     the ones it is sent, and the leader going back to the first entry for
//     it (next 1), at INFO: a new replica being brought up, as every
//     replica placed on a node is. With a log, they report a follower whose
//     log differs from the leader's, and stay WARN.
//   - A replica with no configuration at all not standing for election
//     (noPeers), at INFO: that is an empty replica the placement put on this
//     node, opened before its shard's leader adds it, on purpose.
//   - An inbound RPC cut short by this replica's own transport closing
//     (raft.ErrTransportShutdown), at DEBUG: it happens on every stop of a
//     replica whose peers are sending to it.
func level(l hclog.Level, msg string, args []any) (slog.Level, bool) {
	lvl, ok := slogLevel(l)
	if !ok || l < hclog.Warn {
		return lvl, ok
	}
	if msg == noPeers {
		return slog.LevelInfo, true
	}
	switch v, found := arg(args, quietArg[msg]); {
	case !found:
	case msg == electionNoLeader && fmt.Sprint(v) == "",
		msg == "failed to get previous log" && fmt.Sprint(v) == "0",
		msg == "appendEntries rejected, sending older logs" && fmt.Sprint(v) == "1":
		return slog.LevelInfo, true
	case msg == "failed to decode incoming command":
		if err, _ := v.(error); errors.Is(err, raft.ErrTransportShutdown) {
			return slog.LevelDebug, true
		}
	}
	return lvl, ok
}

// quietArg names, for each of raft's messages level may log lower, the
// argument that tells.
var quietArg = map[string]string{
	electionNoLeader:                             "last-leader-addr",
	"failed to get previous log":                 "last-index",
	"appendEntries rejected, sending older logs": "next",
	"failed to decode incoming command":          "error",
}

// arg is the value of key in hclog's alternating keys and values.
func arg(args []any, key string) (any, bool) {
	if key == "" {
		return nil, false
	}
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == key {
			return args[i+1], true
		}
	}
	return nil, false
}

func (r *raftLogger) Log(l hclog.Level, msg string, args ...any) {
	if lvl, ok := level(l, msg, args); ok && r.l.Enabled(context.Background(), lvl) {
		r.l.Log(context.Background(), lvl, msg, values(args)...)
	}
}

// values returns args with the values hclog formats itself (hclog.Fmt,
// Hex, Octal, Binary, Quote, a stack trace) formatted as hclog does; args
// itself is left as it is.
func values(args []any) []any {
	out := args
	for i := 1; i < len(args); i += 2 {
		var v string
		switch a := args[i].(type) {
		case hclog.Format:
			v = fmt.Sprint(a...)
			if len(a) > 0 {
				if f, ok := a[0].(string); ok {
					v = fmt.Sprintf(f, a[1:]...)
				}
			}
		case hclog.Hex:
			v = "0x" + strconv.FormatUint(uint64(a), 16)
		case hclog.Octal:
			v = "0" + strconv.FormatUint(uint64(a), 8)
		case hclog.Binary:
			v = "0b" + strconv.FormatUint(uint64(a), 2)
		case hclog.Quote:
			v = string(a)
		case hclog.CapturedStacktrace:
			v = string(a)
		default:
			continue
		}
		if &out[i] == &args[i] {
			out = slices.Clone(args)
		}
		out[i] = v
	}
	return out
}

func (r *raftLogger) Trace(msg string, args ...any) { r.Log(hclog.Trace, msg, args...) }
func (r *raftLogger) Debug(msg string, args ...any) { r.Log(hclog.Debug, msg, args...) }
func (r *raftLogger) Info(msg string, args ...any)  { r.Log(hclog.Info, msg, args...) }
func (r *raftLogger) Warn(msg string, args ...any)  { r.Log(hclog.Warn, msg, args...) }
func (r *raftLogger) Error(msg string, args ...any) { r.Log(hclog.Error, msg, args...) }

func (r *raftLogger) enabled(l hclog.Level) bool {
	lvl, ok := slogLevel(l)
	return ok && r.l.Enabled(context.Background(), lvl)
}

func (r *raftLogger) IsTrace() bool { return r.enabled(hclog.Trace) }
func (r *raftLogger) IsDebug() bool { return r.enabled(hclog.Debug) }
func (r *raftLogger) IsInfo() bool  { return r.enabled(hclog.Info) }
func (r *raftLogger) IsWarn() bool  { return r.enabled(hclog.Warn) }
func (r *raftLogger) IsError() bool { return r.enabled(hclog.Error) }

func (r *raftLogger) ImpliedArgs() []any { return r.implied }

func (r *raftLogger) With(args ...any) hclog.Logger {
	return newRaftLoggerNamed(r.base.With(values(args)...), append(slices.Clip(r.implied), args...), r.name)
}

func (r *raftLogger) Name() string { return r.name }

func (r *raftLogger) Named(name string) hclog.Logger {
	if r.name != "" {
		name = r.name + "." + name
	}
	return newRaftLoggerNamed(r.base, r.implied, name)
}

func (r *raftLogger) ResetNamed(name string) hclog.Logger {
	return newRaftLoggerNamed(r.base, r.implied, name)
}

// SetLevel does nothing: the level is the slog handler's.
func (r *raftLogger) SetLevel(hclog.Level) {}

// GetLevel is the least level the slog handler keeps.
func (r *raftLogger) GetLevel() hclog.Level {
	for l := hclog.Trace; l <= hclog.Error; l++ {
		if r.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

func (r *raftLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(r.StandardWriter(opts), "", 0)
}

// StandardWriter logs each write as a line: at opts.ForceLevel if set, else
// at the level a leading [ERROR], [WARN]... names with opts.InferLevels,
// else at Info.
func (r *raftLogger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	if opts == nil {
		opts = &hclog.StandardLoggerOptions{}
	}
	return stdWriter{r, *opts}
}

type stdWriter struct {
	r    *raftLogger
	opts hclog.StandardLoggerOptions
}

func (w stdWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	l := hclog.Info
	switch {
	case w.opts.ForceLevel != hclog.NoLevel:
		l = w.opts.ForceLevel
	case w.opts.InferLevels:
		for _, tag := range []struct {
			prefix string
			l      hclog.Level
		}{{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info}, {"[WARN]", hclog.Warn},
			{"[ERROR]", hclog.Error}, {"[ERR]", hclog.Error}} {
			if rest, ok := strings.CutPrefix(line, tag.prefix); ok {
				line, l = strings.TrimSpace(rest), tag.l
				break
			}
		}
	}
	w.r.Log(l, line)
	return len(p), nil
}

var _ hclog.Logger = (*raftLogger)(nil)
