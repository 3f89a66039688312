package membership

import (
	"encoding/binary"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Place returns the desired replica set of shard among candidates: the r
// candidates with the highest rendezvous (highest-random-weight) score, in
// score order, highest first; all of them when there are fewer than r.
// Duplicate candidates count once.
//
// The score of a node for a shard is xxhash64 of the shard as 4 big-endian
// bytes, then the length of the node id as a uvarint, then the id. A node's
// score does not depend on the other candidates, which gives the properties
// the leaders rely on: every node computes the same set from the same
// candidates, adding a node changes a shard's set only by that node replacing
// the lowest-scored member, and removing a node changes only the sets that
// held it. The encoding is part of the protocol: changing it moves replicas
// on every shard.
func Place(shard uint32, candidates []string, r int) []string {
	if r <= 0 || len(candidates) == 0 {
		return nil
	}
	type scored struct {
		id    string
		score uint64
	}
	all := make([]scored, 0, len(candidates))
	var buf []byte
	for _, id := range candidates {
		buf = binary.BigEndian.AppendUint32(buf[:0], shard)
		buf = binary.AppendUvarint(buf, uint64(len(id)))
		buf = append(buf, id...)
		all = append(all, scored{id: id, score: xxhash.Sum64(buf)})
	}
	slices.SortFunc(all, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
	out := make([]string, 0, min(r, len(all)))
	for i, s := range all {
		if i > 0 && s.id == all[i-1].id {
			continue // equal ids have equal scores, so duplicates are adjacent
		}
		out = append(out, s.id)
		if len(out) == r {
			break
		}
	}
	return out
}
