package snapshot

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"path/filepath"
	"testing"
)

// FuzzInstallHeader: a follower's install layer reads a header from whoever connects to the
// Raft port, and raft hands it install requests whose Peers field names a received copy.
// Neither parser panics; a header is accepted exactly when it is what appendInstallHeader
// writes for a size up to maxInstallSize, and names its copy as the leader's id in hex; an
// accepted copy name is 32 hex digits, so the file it names stays in the replica's
// directory.
func FuzzInstallHeader(f *testing.F) {
	uid := [16]byte{0xde, 0xad, 0xbe, 0xef, 15: 1}
	f.Add(appendInstallHeader(nil, uid, 1<<20))
	f.Add(appendInstallHeader(nil, uid, maxInstallSize+1))
	f.Add(appendInstallHeader(nil, uid, -1))
	f.Add([]byte(installMarker + hex.EncodeToString(uid[:])))
	f.Add([]byte(installMarker + "../../../../etc/passwd0000000000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, size, err := parseInstallHeader(b)
		valid := len(b) == installHdrLen && bytes.HasPrefix(b, []byte(installMagic)) && b[len(installMagic)] == installVersion &&
			int64(binary.BigEndian.Uint64(b[installHdrLen-8:])) >= 0 && int64(binary.BigEndian.Uint64(b[installHdrLen-8:])) <= maxInstallSize
		if valid != (err == nil) {
			t.Fatalf("header %x: %v", b, err)
		}
		if err == nil {
			id, herr := hex.DecodeString(name)
			if herr != nil || len(id) != 16 || !bytes.Equal(appendInstallHeader(nil, [16]byte(id), size), b) {
				t.Fatalf("header %x reads as copy %q of %d bytes", b, name, size)
			}
		}
		if name, err := installCopyName(b); err == nil {
			dir := filepath.Join("replica", "dir")
			path := filepath.Join(dir, installPrefix+name+".done")
			if _, herr := hex.DecodeString(name); herr != nil || len(name) != 32 || filepath.Dir(path) != dir ||
				!bytes.Equal(b, []byte(installMarker+name)) {
				t.Fatalf("install request %q names copy %q (file %s)", b, name, path)
			}
		}
	})
}
