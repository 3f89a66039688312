package cluster

import (
	"maps"
	"testing"
)

// FuzzRemovedFile: removed.json is read at every start, and the nodes it names are never
// placed on again. decodeRemoved never panics; what it accepts, Remove writes back
// (encodeRemoved) as bytes that decode to the same nodes; and it accepts what Remove writes.
func FuzzRemovedFile(f *testing.F) {
	f.Add(encodeRemoved(map[string]bool{"node-2": true, "node-7": true}))
	f.Add(encodeRemoved(map[string]bool{}))
	f.Add([]byte(`null`))
	f.Add([]byte(`["a", 1]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		removed, err := decodeRemoved(b)
		if err != nil {
			return
		}
		again, err := decodeRemoved(encodeRemoved(removed))
		if err != nil || !maps.Equal(again, removed) {
			t.Fatalf("%q decodes to %v; written back, to %v, %v", b, removed, again, err)
		}
	})
}
