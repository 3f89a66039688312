package snapshot

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/chimehq/chime/raftfsm"
	"github.com/hashicorp/raft"
)

// A copy of the shard sent to a follower takes tens of seconds, and raft
// sends it as one stream: cut anywhere, raft opens the snapshot again and
// sends it from the start. So the leader sends its expansions another way,
// over the shard's install layer of the node's raft port, and resumably:
// it names the expansion (a random id kept with it, and the same bytes
// while it is kept, expansionReuse), the follower answers how many bytes of
// it it already holds, and the leader sends the rest. The follower keeps
// what it received of an interrupted copy (one per replica, replaced by the
// next copy it is sent). Once the follower holds the whole copy, the leader
// sends raft's InstallSnapshot request with no data and the copy's id in its
// Peers field (unused by raft since snapshot version 1), and the follower's
// transport hands raft the received file as the request's data: raft on the
// follower installs it exactly as if it had come in the request.
//
// A follower without an install layer (a node of the version before) closes
// the connection before answering; the leader then sends the copy in the
// request, as raft does.

const (
	installMagic   = "chimeins"
	installVersion = 1
	installHdrLen  = len(installMagic) + 1 + 16 + 8
	// installMarker starts the Peers field of an InstallSnapshot request
	// whose data the follower already holds; the copy's id (hex) follows.
	installMarker = "chime-install:"
	installPrefix = "install-" // received copies: install-<id>.part, install-<id>.done
	// maxInstallSize bounds what a follower accepts to store.
	maxInstallSize = 1 << 40
)

// errNoInstallLayer: the follower has no install layer.
var errNoInstallLayer = errors.New("follower has no install layer")

// TransportConfig configures a replica's Transport.
type TransportConfig struct {
	// Layer is the shard's install layer of the node's raft port.
	Layer raft.StreamLayer
	// Dir is where received copies are kept: the replica's raft directory.
	Dir string
	// LastLog returns the last index of this replica's raft log.
	LastLog func() (uint64, error)
	Logger  *slog.Logger
	// Timeout bounds each step of a send or receive: the dial, the header,
	// each write and each read.
	Timeout time.Duration
	// SendHook, if set, is called as a copy is sent, with the bytes of it
	// sent so far; an error cuts the send, so a test makes an install
	// resume.
	SendHook func(sent, size int64) error
}

// Transport is the shard's raft transport with resumable installs.
// It owns its goroutines: the accept loop on the install layer, one per
// copy being received, and the pump that hands raft its RPCs; Close stops
// them, then the network transport.
type Transport struct {
	*raft.NetworkTransport
	layer    raft.StreamLayer
	dir      string                 // where received copies are kept
	lastLog  func() (uint64, error) // this replica's raft log's last index
	logger   *slog.Logger
	timeout  time.Duration // bounds each step of a send or receive
	consumer chan raft.RPC // what raft reads
	// sendHook, if set, is called as a copy is sent, with the bytes of it
	// sent so far; an error cuts the send.
	sendHook func(sent, size int64) error

	recv     sync.Mutex // one copy received at a time
	mu       sync.Mutex
	conns    map[net.Conn]struct{} // being received, closed by Close
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// NewTransport wraps nt, the shard's raft transport, so that it sends the
// store's expansions over cfg.Layer, resumably, and hands raft the copies
// received there; it starts its goroutines.
func NewTransport(nt *raft.NetworkTransport, cfg TransportConfig) *Transport {
	t := &Transport{NetworkTransport: nt, layer: cfg.Layer, dir: cfg.Dir, lastLog: cfg.LastLog, logger: cfg.Logger,
		timeout: cfg.Timeout, sendHook: cfg.SendHook,
		consumer: make(chan raft.RPC), conns: make(map[net.Conn]struct{}), stop: make(chan struct{})}
	t.wg.Add(2)
	go t.acceptLoop()
	go t.pump()
	return t
}

func (t *Transport) Consumer() <-chan raft.RPC { return t.consumer }

// Close stops receiving copies and closes the network transport.
func (t *Transport) Close() error {
	t.stopOnce.Do(func() {
		close(t.stop)
		// Teardown: these Closes stop the accept loop and the receives;
		// what a receive holds is kept on disk for the next send.
		_ = t.layer.Close()
		t.mu.Lock()
		for c := range t.conns {
			_ = c.Close()
		}
		t.mu.Unlock()
		t.wg.Wait()
	})
	return t.NetworkTransport.Close()
}

// InstallSnapshot sends an expansion resumably, anything else as raft does.
func (t *Transport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest,
	resp *raft.InstallSnapshotResponse, data io.Reader) error {
	e, ok := data.(*expansion)
	if !ok {
		return t.NetworkTransport.InstallSnapshot(id, target, args, resp, data)
	}
	err := t.send(target, e)
	if errors.Is(err, errNoInstallLayer) {
		return t.NetworkTransport.InstallSnapshot(id, target, args, resp, data)
	}
	if err != nil {
		return fmt.Errorf("sending a copy to %s: %w", id, err)
	}
	marked := *args
	marked.Peers = append([]byte(installMarker), hex.EncodeToString(e.x.uid[:])...)
	err = t.NetworkTransport.InstallSnapshot(id, target, &marked, resp, bytes.NewReader(nil))
	if err != nil || !resp.Success {
		// A follower refuses a copy older than its own log (attach): the
		// next install writes a new one instead of sending this again.
		e.store.forget(e.x)
	}
	return err
}

// send sends e's copy to target's install layer, from where it left off.
func (t *Transport) send(target raft.ServerAddress, e *expansion) error {
	c, err := t.layer.Dial(target, t.timeout)
	if err != nil {
		return err
	}
	// The outcome is the follower's answer, read before the Close.
	defer func() { _ = c.Close() }()
	size := e.x.meta.Size
	hdr := appendInstallHeader(make([]byte, 0, installHdrLen), e.x.uid, size)
	// Each step is bounded, or a follower that stops reading or answering
	// holds raft's install forever.
	if err := c.SetDeadline(time.Now().Add(t.timeout)); err != nil {
		return err
	}
	if _, err := c.Write(hdr); err != nil {
		return err
	}
	var word [8]byte
	if _, err := io.ReadFull(c, word[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			// Closed unanswered (and, the header unread, reset): the
			// follower's raft port has no install layer to route it to.
			return errNoInstallLayer
		}
		return err
	}
	have := int64(binary.BigEndian.Uint64(word[:]))
	if have < 0 || have > size {
		return fmt.Errorf("follower holds %d bytes of a %d-byte copy", have, size)
	}
	if err := e.seek(have); err != nil {
		return err
	}
	buf := make([]byte, 32<<10)
	for sent := have; sent < size; {
		n, err := e.Read(buf[:min(int64(len(buf)), size-sent)])
		if n > 0 {
			if err := c.SetWriteDeadline(time.Now().Add(t.timeout)); err != nil {
				return err
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return err
			}
			sent += int64(n)
			if t.sendHook != nil {
				if err := t.sendHook(sent, size); err != nil {
					return err
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && sent < size {
				return io.ErrUnexpectedEOF
			}
			if !errors.Is(err, io.EOF) {
				return err
			}
		}
	}
	// The follower syncs the copy before it answers.
	if err := c.SetReadDeadline(time.Now().Add(t.timeout)); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, word[:1]); err != nil {
		return err
	}
	if word[0] != 1 {
		return errors.New("follower refused the copy")
	}
	return nil
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.layer.Accept()
		if err != nil {
			return // the layer is closed
		}
		t.mu.Lock()
		select {
		case <-t.stop:
			t.mu.Unlock()
			_ = c.Close()
			return
		default:
		}
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			if err := t.receive(c); err != nil {
				t.logger.Warn("receiving a copy of the shard", "from", c.RemoteAddr(), "err", err)
			}
			t.mu.Lock()
			delete(t.conns, c)
			t.mu.Unlock()
			_ = c.Close() // the receive is over: its outcome is the answer it wrote
		}()
	}
}

// receive takes one copy, or the rest of one, from a leader.
func (t *Transport) receive(c net.Conn) error {
	// Without it a leader that sends nothing would hold the connection and
	// its goroutine until the transport closes.
	if err := c.SetReadDeadline(time.Now().Add(t.timeout)); err != nil {
		return err
	}
	hdr := make([]byte, installHdrLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return err
	}
	name, size, err := parseInstallHeader(hdr)
	if err != nil {
		return err
	}
	t.recv.Lock()
	defer t.recv.Unlock()
	part := filepath.Join(t.dir, installPrefix+name+".part")
	done := filepath.Join(t.dir, installPrefix+name+".done")
	var word [8]byte
	if fi, err := os.Stat(done); err == nil && fi.Size() == size {
		binary.BigEndian.PutUint64(word[:], uint64(size))
		if _, err := c.Write(word[:]); err != nil {
			return err
		}
		_, err := c.Write([]byte{1})
		return err
	}
	if err := removeReceived(t.dir, part); err != nil {
		return err
	}
	f, err := os.OpenFile(part, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	// Closes f on the early returns, unchecked: the next send resumes after
	// what of it is on disk. A whole copy is closed, checked, before its
	// rename.
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	have := fi.Size()
	if have > size {
		if err := f.Truncate(0); err != nil {
			return err
		}
		have = 0
	}
	binary.BigEndian.PutUint64(word[:], uint64(have))
	if _, err := c.Write(word[:]); err != nil {
		return err
	}
	// What arrives is kept even if the connection breaks: the next send
	// resumes after it.
	w := bufio.NewWriterSize(f, 256<<10)
	_, err = io.CopyN(w, deadlineReader{c, t.timeout}, size-have)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(part, done); err != nil {
		return err
	}
	_, err = c.Write([]byte{1})
	return err
}

// appendInstallHeader appends the header a leader sends before a copy: the
// magic, the version, the copy's id and its size.
func appendInstallHeader(dst []byte, uid [16]byte, size int64) []byte {
	dst = append(dst, installMagic...)
	dst = append(dst, installVersion)
	dst = append(dst, uid[:]...)
	return binary.BigEndian.AppendUint64(dst, uint64(size))
}

// parseInstallHeader reads the installHdrLen bytes of a header: the copy's
// name (its id in hex, as its files are named) and size.
func parseInstallHeader(hdr []byte) (name string, size int64, err error) {
	if len(hdr) != installHdrLen || string(hdr[:len(installMagic)]) != installMagic || hdr[len(installMagic)] != installVersion {
		return "", 0, errors.New("not an install request")
	}
	size = int64(binary.BigEndian.Uint64(hdr[len(installMagic)+17:]))
	if size < 0 || size > maxInstallSize {
		return "", 0, fmt.Errorf("a copy of %d bytes", size)
	}
	return hex.EncodeToString(hdr[len(installMagic)+1 : len(installMagic)+17]), size, nil
}

// installCopyName reads the name of the copy an install request's Peers field
// names (after installMarker).
func installCopyName(peers []byte) (string, error) {
	name, ok := bytes.CutPrefix(peers, []byte(installMarker))
	if _, err := hex.DecodeString(string(name)); !ok || err != nil || len(name) != 32 {
		return "", fmt.Errorf("install request names copy %q", name)
	}
	return string(name), nil
}

// removeReceived deletes every received copy in dir but keep.
func removeReceived(dir, keep string) error {
	names, err := filepath.Glob(filepath.Join(dir, installPrefix+"*"))
	for _, n := range names {
		if n == keep {
			continue
		}
		if rerr := os.Remove(n); err == nil {
			err = rerr
		}
	}
	return err
}

// deadlineReader reads a connection, each read within timeout.
type deadlineReader struct {
	c       net.Conn
	timeout time.Duration
}

func (d deadlineReader) Read(p []byte) (int, error) {
	if err := d.c.SetReadDeadline(time.Now().Add(d.timeout)); err != nil {
		return 0, err
	}
	return d.c.Read(p)
}

// pump hands raft the transport's RPCs, giving an InstallSnapshot request
// whose copy was received on the install layer that copy as its data.
func (t *Transport) pump() {
	defer t.wg.Done()
	in := t.NetworkTransport.Consumer()
	for {
		var rpc raft.RPC
		select {
		case rpc = <-in:
		case <-t.stop:
			return
		}
		if req, ok := rpc.Command.(*raft.InstallSnapshotRequest); ok && bytes.HasPrefix(req.Peers, []byte(installMarker)) {
			if err := t.attach(&rpc, req); err != nil {
				rpc.Respond(nil, err)
				continue
			}
		}
		select {
		case t.consumer <- rpc:
		case <-t.stop:
			rpc.Respond(nil, raft.ErrTransportShutdown)
			return
		}
	}
}

// attach makes the received copy req names the data of rpc.
func (t *Transport) attach(rpc *raft.RPC, req *raft.InstallSnapshotRequest) error {
	name, err := installCopyName(req.Peers)
	if err != nil {
		return err
	}
	path := filepath.Join(t.dir, installPrefix+name+".done")
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("the copy the install request names: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return err
	}
	if err := t.checkNotOlder(f); err != nil {
		_ = f.Close()
		// Best effort: the leader sends a newer copy instead, and receiving
		// it removes this one (removeReceived), or fails.
		_ = os.Remove(path)
		return err
	}
	req.Peers = nil
	req.Size = fi.Size()
	rpc.Reader = &receivedCopy{f: f, logger: t.logger}
	return nil
}

// checkNotOlder refuses a copy whose state is older than the last entry of
// this replica's raft log, and leaves f at its start. After an install raft
// goes on from the copy's index, and hashicorp/raft counts as committed
// every entry the follower holds up to the leader's commit index, including
// entries past those the leader's next request compares: an entry of a
// deposed leader's term that this replica holds beyond the copy would be
// applied unchecked. (A leader paused for seconds, on waking, appended an
// entry, then was sent a copy a minute old, applied that entry, and gave
// seven events other seqs than the rest of the shard.) A copy at or past
// the end of the log leaves every such entry at or below the state it
// restores, which the FSM skips. The leader then writes a newer copy.
func (t *Transport) checkNotOlder(f *os.File) error {
	h, err := raftfsm.ReadSnapshotHeader(f)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	last, err := t.lastLog()
	if err != nil {
		return err
	}
	if h.AppliedIndex < last {
		return fmt.Errorf("the copy holds the log up to index %d, older than this replica's log (%d)", h.AppliedIndex, last)
	}
	return nil
}

// receivedCopy reads a received copy once: raft copies it into its own
// snapshot store, and at its end it is deleted.
type receivedCopy struct {
	f      *os.File
	logger *slog.Logger
}

func (r *receivedCopy) Read(p []byte) (int, error) {
	if r.f == nil {
		return 0, io.EOF
	}
	n, err := r.f.Read(p)
	if errors.Is(err, io.EOF) {
		_ = r.f.Close() // read only
		// raft has the copy: a file left behind is a whole shard's worth of
		// disk, kept until the next copy received removes it.
		if rerr := os.Remove(r.f.Name()); rerr != nil {
			r.logger.Warn("removing an installed copy of the shard", "err", rerr)
		}
		r.f = nil
	}
	return n, err
}
