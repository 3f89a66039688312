package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// fsync syncs a file or a directory. The tests replace it to see that every
// step happens, and in order.
var fsync = (*os.File).Sync

// WriteFile replaces path with data, with permissions perm: after a crash
// path holds either what it held before or data, and data once WriteFile
// returns nil.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return err
	}
	return f.Commit()
}

// File is the new content of a file, written to a temporary file beside it
// that takes the file's name only at Commit.
type File struct {
	f    *os.File
	path string
	done bool
}

// Create starts replacing path, with permissions perm: nothing appears
// under path until Commit. The caller must call Commit or Abort.
func Create(path string, perm fs.FileMode) (*File, error) {
	dir, name := filepath.Split(path)
	f, err := os.CreateTemp(dir, name+".*.tmp")
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(perm); err != nil {
		// Nothing was written: the Chmod error is the one to report, and a
		// temporary file left behind has a .tmp name, never the target's.
		_ = f.Close()
		_ = os.Remove(f.Name())
		return nil, err
	}
	return &File{f: f, path: path}, nil
}

// Write writes to the temporary file.
func (f *File) Write(p []byte) (int, error) { return f.f.Write(p) }

// Commit syncs what was written, renames it over the target and syncs the
// target's directory. On an error before the rename the temporary file is
// removed and the target is unchanged.
func (f *File) Commit() error {
	if f.done {
		return errors.New("durable: " + f.path + ": already committed or aborted")
	}
	f.done = true
	err := fsync(f.f)
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.f.Name(), f.path)
	}
	if err != nil {
		_ = os.Remove(f.f.Name()) // err is the one to report; a .tmp left behind is never read
		return err
	}
	return SyncDir(filepath.Dir(f.path))
}

// Abort removes the temporary file and leaves the target as it was. It does
// nothing after Commit, so that it can be deferred.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	// What was written is being thrown away: a close error cannot lose
	// anything, and a .tmp a failed removal leaves behind is never read.
	_ = f.f.Close()
	_ = os.Remove(f.f.Name())
}

// SyncDir makes the changes to dir's entries (a file created, renamed or
// removed) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(fsync(d), d.Close())
}
