package auth

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// DefaultRefusalWindow is how often, at most, the audit log takes a line
// for the refusals of one credential from one address after the first:
// a caller retrying in a loop cannot flood it.
const DefaultRefusalWindow = 10 * time.Second

// refusalLog writes refused calls to the audit log: the first refusal of a
// caller (its credential, or how it failed to show one) from one host for
// one method, then at most one line a window, the latest refusal with how
// many came since the line before (auditLine.Repeated). A caller that
// stops being refused is forgotten a window later. Methods are Chime's,
// so a caller has at most as many lines a window as there are methods:
// any other name counts as one.
type refusalLog struct {
	window time.Duration
	write  func(auditLine)

	mu     sync.Mutex
	byKey  map[string]*refusals
	closed bool
}

// refusals is what refusalLog keeps of one caller and host between lines.
type refusals struct {
	last  auditLine // the latest refusal not written yet
	more  int       // the refusals since the last line written
	timer *time.Timer
}

func newRefusalLog(window time.Duration, write func(auditLine)) *refusalLog {
	return &refusalLog{window: window, write: write, byKey: map[string]*refusals{}}
}

func (r *refusalLog) add(l auditLine) {
	host := l.Peer
	if h, _, err := net.SplitHostPort(l.Peer); err == nil {
		host = h // a caller's connections differ by port only
	}
	method := l.Method
	if !strings.HasPrefix(method, "/chime.v1.") && !strings.HasPrefix(method, reflectionPrefix) && !strings.HasPrefix(method, "HTTP ") {
		method = "another method"
	}
	key := l.Who + "\x00" + host + "\x00" + method
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.byKey[key]; e != nil {
		e.last, e.more = l, e.more+1
		return
	}
	if !r.closed {
		r.byKey[key] = &refusals{timer: time.AfterFunc(r.window, func() { r.tick(key) })}
	}
	r.write(l)
}

// tick writes what key's window gathered, if anything, and forgets key
// when nothing came.
func (r *refusalLog) tick(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.byKey[key]
	if e == nil {
		return
	}
	if e.more == 0 {
		delete(r.byKey, key)
		return
	}
	l := e.last
	l.Repeated, e.more = e.more, 0
	e.timer.Reset(r.window)
	r.write(l)
}

// close stops the timers and writes what they held back.
func (r *refusalLog) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for key, e := range r.byKey {
		e.timer.Stop()
		if e.more > 0 {
			l := e.last
			l.Repeated = e.more
			r.write(l)
		}
		delete(r.byKey, key)
	}
}

// RotatingFile is an append-only file that is rotated once it would grow
// past a size: file is renamed file.1, file.1 file.2 and so on, the oldest
// beyond Keep removed, and a new file started. It is written by hand
// rather than with a rotation library because the one in wide use
// (lumberjack) starts a goroutine that nothing stops; this one does all its
// work in Write.
type RotatingFile struct {
	path     string
	maxBytes int64
	keep     int

	mu   sync.Mutex
	f    *os.File
	size int64
}

// OpenRotatingFile opens path for appending (mode 0600), to be rotated once
// it would pass maxBytes (0: never), keeping keep rotated files.
func OpenRotatingFile(path string, maxBytes int64, keep int) (*RotatingFile, error) {
	r := &RotatingFile{path: path, maxBytes: maxBytes, keep: keep}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *RotatingFile) open() error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close() // nothing written yet; the Stat error is the one to report
		return err
	}
	r.f, r.size = f, fi.Size()
	return nil
}

// Write appends b, rotating first if b would take the file past its size.
// A line is never split between two files.
func (r *RotatingFile) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return 0, os.ErrClosed
	}
	if r.maxBytes > 0 && r.size > 0 && r.size+int64(len(b)) > r.maxBytes {
		if err := r.rotate(); err != nil {
			return 0, fmt.Errorf("rotating %s: %w", r.path, err)
		}
	}
	n, err := r.f.Write(b)
	r.size += int64(n)
	return n, err
}

func (r *RotatingFile) rotate() error {
	if err := r.f.Close(); err != nil {
		return err
	}
	r.f = nil
	name := func(i int) string { return fmt.Sprintf("%s.%d", r.path, i) }
	// Beyond what is kept, once shifted. Most often there is none; one a
	// failed removal leaves is replaced by the rename of the next below.
	_ = os.Remove(name(r.keep))
	for i := r.keep - 1; i >= 1; i-- {
		if err := os.Rename(name(i), name(i+1)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	if r.keep > 0 {
		if err := os.Rename(r.path, name(1)); err != nil {
			return err
		}
	} else if err := os.Remove(r.path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(r.path)); err == nil {
		// The renames, before the new file takes the name. Best effort, as
		// the Open above: a crash before they reach the disk can leave the
		// old names, never lose a record, while failing here would fail the
		// Write and lose one.
		_ = d.Sync()
		_ = d.Close()
	}
	return r.open()
}

// Close closes the file.
func (r *RotatingFile) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}
