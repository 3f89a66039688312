package backup

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Options are how Take copies a cluster. The zero value copies each shard
// once, with no timeout, on the real clock, reporting nothing.
type Options struct {
	// Source is the address of the node asked, recorded in the manifest
	// and named in errors.
	Source string
	// Retries is how many times a shard whose copy breaks off in a way
	// another attempt can cure (UNAVAILABLE, ABORTED, no data for Timeout)
	// is copied again from the start.
	Retries int
	// Timeout bounds the cluster map request and each wait for the next
	// message of a shard's copy, not the whole copy, which takes as long
	// as the shard is large; 0 means no bound. TimeoutName is how an error
	// names it (chimectl: "--timeout"); empty, it is not named.
	Timeout     time.Duration
	TimeoutName string
	// Key, when set, signs the manifest (Manifest.Sign): a restore checks
	// it with the same key. Without one the manifest is unsigned, and a
	// restore takes it only when told to (Authenticate).
	Key []byte
	// Progress, when set, is called as the copy goes (on Take's goroutine).
	Progress func(Progress)
	// Now and Sleep are the clock: nil means real time. Tests pass a fake
	// pair.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
}

// Progress is one report of Take's: exactly one of these holds.
//   - Copied is set: the shard's copy is committed (Took is how long it took).
//   - Retry is set: the copy broke off with Retry and is started again,
//     attempt Attempt of Retries.
//   - Neither: Bytes of the shard's copy have arrived so far (about once a
//     second, for a copy that takes longer).
type Progress struct {
	Shard, ShardCount uint32
	Bytes             int64
	Copied            *Shard
	Took              time.Duration
	Retry             error
	Attempt, Retries  int
}

// errIncomplete is the advice that ends a failed backup's error.
const errIncomplete = "%s has no manifest.json, so it is not a usable backup: delete it and run backup again"

// Take copies the whole state of a running cluster into dir, which must be
// new or empty (the caller checks, naming its own flag; Take creates it):
// it asks c for the cluster map (retried as the client retries a read),
// copies each shard through chime.v1.Admin/Backup on c.Conn() into its
// file (ShardWriter), checking what arrived against the summary the leader
// sent last, and writes the manifest last (WriteManifest), naming the
// cluster's id and, with o.Key, signed. The node a copy goes to relays the
// copies of shards it does not lead. This is chimectl backup; chime-jepsen
// takes its backups with it too.
//
// On an error no manifest is written, so dir is not a usable backup, and
// the error says so; a shard file that was not completely written is
// never left under its name.
func Take(ctx context.Context, c *client.Client, dir string, o Options) (*Manifest, error) {
	if o.Key != nil {
		// A key that cannot sign fails the backup before it copies anything.
		if err := checkKey(o.Key); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, &Error{Dir: dir, Err: err}
	}
	mctx, cancel := o.requestCtx(ctx)
	var m *chimev1.ClusterMap
	err := c.Do(mctx, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		m, err = chimev1.NewAdminClient(cc).GetClusterMap(ctx, &chimev1.GetClusterMapRequest{})
		return err
	})
	cancel()
	if err != nil {
		return nil, err
	}
	if m.GetShardCount() == 0 {
		return nil, fmt.Errorf("the cluster map from %s has no shards", o.Source)
	}
	man := &Manifest{
		Format: Format, ClusterID: m.GetClusterId(), Source: o.Source, ShardCount: int(m.GetShardCount()),
		Replication: int(max(m.GetReplication(), 1)), Retention: m.GetRetention().AsDuration(),
	}
	// A copy is a stream, sent once; backupShard starts a broken one again.
	ac := chimev1.NewAdminClient(c.Conn())
	for s := range m.GetShardCount() {
		entry, err := o.backupShard(ctx, ac, dir, s, m.GetShardCount())
		if err != nil {
			if st, ok := status.FromError(err); ok {
				err = fmt.Errorf("%s: %s", st.Code(), st.Message())
			}
			return nil, fmt.Errorf("backup: shard %d: %v; "+errIncomplete, s, err, dir)
		}
		man.Shards = append(man.Shards, entry)
	}
	man.Created = o.now().UTC()
	if o.Key != nil {
		if err := man.Sign(o.Key); err != nil {
			return nil, fmt.Errorf("backup: signing the manifest: %v; "+errIncomplete, err, dir)
		}
	}
	if err := WriteManifest(dir, man); err != nil {
		return nil, fmt.Errorf("%w; "+errIncomplete, err, dir)
	}
	return man, nil
}

func (o *Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

func (o *Options) progress(p Progress) {
	if o.Progress != nil {
		o.Progress(p)
	}
}

// requestCtx bounds one request by Timeout (no bound when it is 0).
func (o *Options) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if o.Timeout > 0 {
		return context.WithTimeout(ctx, o.Timeout)
	}
	return context.WithCancel(ctx)
}

// pause waits d, or until ctx is done.
func (o *Options) pause(ctx context.Context, d time.Duration) error {
	if o.Sleep != nil {
		return o.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// backupShard copies shard s into dir, again from the start when a copy
// breaks off in a way another attempt can cure, up to Retries times.
func (o *Options) backupShard(ctx context.Context, ac chimev1.AdminClient, dir string, s, count uint32) (Shard, error) {
	for attempt := 1; ; attempt++ {
		entry, err := o.copyShard(ctx, ac, dir, s, count)
		if err == nil {
			return entry, nil
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		default:
			return Shard{}, err
		}
		if attempt > o.Retries || ctx.Err() != nil {
			return Shard{}, err
		}
		o.progress(Progress{Shard: s, ShardCount: count, Retry: err, Attempt: attempt, Retries: o.Retries})
		if err := o.pause(ctx, time.Duration(attempt)*500*time.Millisecond); err != nil {
			return Shard{}, err
		}
	}
}

// errStalled ends a shard's copy that sent nothing for Timeout.
var errStalled = errors.New("stalled")

// copyShard copies shard s once, into its file in dir, and checks what
// arrived against the summary the leader sent last.
func (o *Options) copyShard(ctx context.Context, ac chimev1.AdminClient, dir string, s, count uint32) (_ Shard, err error) {
	w, err := CreateShard(dir, s)
	if err != nil {
		return Shard{}, err
	}
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()
	// Timeout bounds each wait for the next message: the idle timer cancels
	// the copy when it runs out, and is reset by every message.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var idle *time.Timer
	if o.Timeout > 0 {
		idle = time.AfterFunc(o.Timeout, func() { cancel(errStalled) })
		defer idle.Stop()
		defer func() {
			if errors.Is(context.Cause(ctx), errStalled) {
				name := ""
				if o.TimeoutName != "" {
					name = " (" + o.TimeoutName + ")"
				}
				err = status.Errorf(codes.DeadlineExceeded, "no data for %s%s", o.Timeout, name)
			}
		}()
	}
	stream, err := ac.Backup(ctx, &chimev1.BackupRequest{Shard: s})
	if err != nil {
		return Shard{}, err
	}
	start := o.now()
	lastReport := start
	var sum *chimev1.BackupSummary
	for {
		msg, err := stream.Recv()
		if idle != nil {
			idle.Reset(o.Timeout)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Shard{}, err
		}
		if sum != nil {
			return Shard{}, status.Error(codes.Internal, "data after the stream's summary")
		}
		if _, err := w.Write(msg.GetData()); err != nil {
			return Shard{}, err
		}
		sum = msg.GetSummary()
		if now := o.now(); now.Sub(lastReport) >= time.Second {
			o.progress(Progress{Shard: s, ShardCount: count, Bytes: w.Size()})
			lastReport = now
		}
	}
	switch {
	case sum == nil:
		// The stream ended without its summary: a node went away mid-copy.
		return Shard{}, status.Errorf(codes.Unavailable, "the copy ended after %d bytes without its summary", w.Size())
	case sum.GetShard() != s:
		return Shard{}, fmt.Errorf("the leader sent a copy of shard %d", sum.GetShard())
	case sum.GetSize() != uint64(w.Size()) || !bytes.Equal(sum.GetSha256(), w.SHA256()):
		return Shard{}, status.Errorf(codes.Aborted, "received %d bytes with sha256 %x, the leader sent %d bytes with sha256 %s",
			w.Size(), w.SHA256(), sum.GetSize(), hex.EncodeToString(sum.GetSha256()))
	}
	entry, err := w.Commit()
	if err != nil {
		return Shard{}, err
	}
	entry.AppliedIndex, entry.AppliedTerm, entry.Node = sum.GetAppliedIndex(), sum.GetAppliedTerm(), sum.GetNode()
	o.progress(Progress{Shard: s, ShardCount: count, Bytes: entry.Size, Copied: &entry, Took: o.now().Sub(start)})
	return entry, nil
}
