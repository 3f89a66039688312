package raftfsm

import (
	"hash/maphash"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// idFilter tells the apply goroutine that an id is certainly new to its shard, so that
// creating an event does not search Pebble for it. Every created event first looks its id up,
// and for a new id the lookup is a miss that seeks every memtable and every L0 sublevel and
// level, consulting a bloom filter and opening a table iterator for each: 14% of an ingesting
// cluster's CPU, and BenchmarkIngestCPU/delay-3-shards 4.29 → 3.39 µs per event without it.
//
// It is a split-block Bloom filter over every id the shard stores (and those expired since it
// was built, which cost only false positives), held in memory only. It has no false negatives: a "maybe" costs the Pebble lookup
// it used to, a "no" is certain. It never changes what an apply decides, only whether apply
// reads Pebble to decide it, so replicas stay deterministic whatever their filters hold.
//
// It is built in the background, because a shard of ten million events takes seconds to scan:
//
//  1. The FSM creates the filter before anything can be applied to it (NewFSM, or the end of
//     a Restore), and from then on every apply adds the ids it creates.
//  2. Once the pending events are loaded (LoadPending), so that the scan does not delay a
//     restarting shard's wheel, a goroutine opens a Pebble iterator over the shard's ids and
//     adds each one. A node runs one scan at a time, so that a restart's scans take one core
//     at most, not one per shard.
//
// Every id is therefore committed before the iterator opened, and scanned, or applied after
// the filter existed, and added. Until the scan ends the filter answers "maybe" for
// everything. Apply is the only reader. Apply and the scan both write, with atomic ORs while
// the scan runs.
//
// When a generation fills, apply adds one as large as all the others together, so the filter
// doubles without reading Pebble: a scan reads every stored id, and rebuilding at each doubling
// read each id twice over a shard's growth, 8% of an ingesting cluster's CPU. A query asks
// every generation, a few cache lines for a shard of millions. Generations never forget an id,
// though: with a retention, ids expire as fast as new ones come, and the filter would grow for
// as long as the shard lives. So once half of what the filter holds is gone (or it has
// maxFilterGens generations), apply starts a new filter sized for twice the ids the shard
// stores, built by the same scan while apply adds new ids to both, which replaces the old one
// when the scan ends (rebuildIDFilter); meanwhile the old one grows by generations a quarter
// of the last, as a scan reads ids far faster than apply creates them. It costs 16 bits per
// id at capacity, and the capacity is at most twice what the filter holds: 2 to 4 bytes a
// stored id, up to 6 during a rebuild. The first is sized for a quarter more ids than the
// shard holds when it opens: twice as many cost a node holding a hundred million pending
// events 400 MB instead of 250 for filters with little to add.
type idFilter struct {
	seed   maphash.Seed
	gens   []*bloomGen // apply goroutine only; the scan holds its own pointer to gens[0]
	ready  atomic.Bool // the scan has added every id stored before it began
	minIDs int         // the least capacity of a generation (minFilterIDs unless a test's Knobs say)

	scanning bool          // a scan was started; apply goroutine only
	stop     chan struct{} // closed to end the scan early
	done     chan struct{} // closed when the scan goroutine has returned
}

// minFilterIDs is the least capacity of a generation: 512 KiB.
const minFilterIDs = 1 << 18

// maxFilterGens bounds the generations a query asks: from minFilterIDs, eight doublings reach
// 64 million ids in one shard, and a rebuild then folds them into one.
const maxFilterGens = 8

const (
	// filterBitsPerID gives a false-positive rate of about 0.1% at capacity. 12 gave 0.45%,
	// and the Pebble lookups of the false positives cost 1.5% of an ingesting cluster's CPU.
	filterBitsPerID = 16
	blockWords      = 8 // 512-bit blocks: one cache line per lookup
)

// bloomGen is one generation: a split-block Bloom filter (as in Parquet), where an id sets
// one bit in each of the 8 words of one block.
type bloomGen struct {
	words    []atomic.Uint64
	blocks   uint64
	capacity int
	added    int // ids added by apply, plus what the scan was expected to add; apply only
}

func newBloomGen(capacity int) *bloomGen {
	blocks := uint64(max(1, (capacity*filterBitsPerID+511)/512))
	return &bloomGen{words: make([]atomic.Uint64, blocks*blockWords), blocks: blocks, capacity: capacity}
}

// blockSalts are the odd multipliers of Parquet's split-block Bloom filter, one per word.
var blockSalts = [blockWords]uint32{0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31}

// block returns the words of h's block: the high half of h picks it (multiply-shift, no
// modulo), the low half the bit in each word.
func (g *bloomGen) block(h uint64) []atomic.Uint64 {
	b := (h >> 32) * g.blocks >> 32
	return g.words[b*blockWords : (b+1)*blockWords]
}

// add sets h's bits. shared says another goroutine may be adding too (the scan runs): then it
// uses atomic ORs, which cost more than a load and a store.
func (g *bloomGen) add(h uint64, shared bool) {
	w := g.block(h)
	for i, salt := range blockSalts {
		if bit := uint64(1) << (uint32(h) * salt >> 26); shared {
			w[i].Or(bit)
		} else {
			w[i].Store(w[i].Load() | bit)
		}
	}
}

func (g *bloomGen) mayContain(h uint64) bool {
	w := g.block(h)
	for i, salt := range blockSalts {
		if w[i].Load()&(uint64(1)<<(uint32(h)*salt>>26)) == 0 {
			return false
		}
	}
	return true
}

// newIDFilter gives the FSM a new filter, which scanIDFilter completes. stored is how many
// ids the shard holds now. Called on the apply goroutine (or before it exists), with no filter
// running.
func (f *FSM) newIDFilter(stored int) {
	f.ap.idf = filterFor(stored, stored+stored/4, f.st.filterMin)
}

// filterFor returns an empty filter of the given capacity (at least minIDs) that counts
// stored ids as added: its scan adds them.
func filterFor(stored, capacity, minIDs int) *idFilter {
	g := newBloomGen(max(minIDs, capacity))
	g.added = stored
	return &idFilter{seed: maphash.MakeSeed(), gens: []*bloomGen{g}, minIDs: minIDs, stop: make(chan struct{}), done: make(chan struct{})}
}

// scanIDFilter starts the scan of the FSM's filter, unless there is no filter or its scan has
// begun. Called on the apply goroutine (or before it exists).
func (f *FSM) scanIDFilter() {
	if idf := f.ap.idf; idf != nil {
		f.scan(idf)
	}
}

// scan starts idf's scan, unless it has begun. Called on the apply goroutine (or before it
// exists).
func (f *FSM) scan(idf *idFilter) {
	if idf.scanning {
		return
	}
	idf.scanning = true
	g, st := idf.gens[0], f.st
	st.scans.Add(1)
	go func() {
		defer st.scans.Done()
		defer close(idf.done)
		select { // one scan at a time per node
		case st.scanSlot <- struct{}{}:
			defer func() { <-st.scanSlot }()
		case <-idf.stop:
			return
		case <-st.closing:
			return
		}
		select { // the slot and closing may both have been ready
		case <-st.closing:
			return
		default:
		}
		idf.scan(f.db, g, appendShardTag(nil, f.shard, tagID), appendShardTag(nil, f.shard, tagID+1), st.closing, st.knobs.IDScan)
	}()
}

// rebuildIDFilter starts a filter sized for twice the ids the shard stores, which replaces the
// current one once its scan is done (takeRebuiltIDFilter): half of the current one's ids are
// gone, or it has as many generations as a query should ask. Rebuilt from what is stored, it
// holds only live ids. Apply adds each new id to both until then. Called on the apply
// goroutine.
func (f *FSM) rebuildIDFilter(stored int) {
	a := &f.ap
	if a.idfNext != nil || a.idf == nil || !a.idf.ready.Load() {
		return // one rebuild at a time, and none while the first scan runs
	}
	// Its scan starts once this apply has committed (apply), so that the ids this batch
	// created before it existed are in the scan's view.
	a.idfNext = filterFor(stored, 2*stored, f.st.filterMin)
}

// takeRebuiltIDFilter replaces the filter with the rebuilt one once its scan is done. Called
// on the apply goroutine.
func (f *FSM) takeRebuiltIDFilter() {
	a := &f.ap
	if n := a.idfNext; n != nil && n.ready.Load() {
		<-n.done
		a.idf, a.idfNext = n, nil
	}
}

// stopIDFilter ends the filters' scans, if any run, and drops the filters. Called on the
// apply goroutine, or after it has stopped.
func (f *FSM) stopIDFilter() {
	for _, idf := range []*idFilter{f.ap.idf, f.ap.idfNext} {
		if idf != nil && idf.scanning {
			close(idf.stop)
			<-idf.done
		}
	}
	f.ap.idf, f.ap.idfNext = nil, nil
}

// scan adds every id stored in [lower, upper) to g, and marks the filter ready if it reads to
// the end. On an error it leaves the filter unready, which costs speed, not correctness. It
// returns early when the filter is stopped or the store is closing. hook (Knobs.IDScan), if
// set, runs once the iterator is open.
func (idf *idFilter) scan(db *pebble.DB, g *bloomGen, lower, upper []byte, closing <-chan struct{}, hook func()) {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return
	}
	defer func() { _ = it.Close() }()
	if hook != nil {
		hook()
	}
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		g.add(maphash.Bytes(idf.seed, it.Key()[len(lower):]), true)
		if n++; n%4096 == 0 {
			select {
			case <-idf.stop:
				return
			case <-closing:
				return
			default:
			}
		}
	}
	if it.Error() == nil {
		idf.ready.Store(true)
	}
}

// add records an id apply creates, in the newest generation, starting another when that is
// full, and reports whether the filter should be rebuilt (rebuildIDFilter): when half of the
// ids it holds are no longer stored (stored counts those the shard holds now), or it has
// maxFilterGens generations. Until then a new generation is as large as all the others, so
// the filter doubles; once a rebuild is due, a new one is a quarter of the last, enough for
// what apply creates while the rebuild's scan runs.
func (idf *idFilter) add(id string, stored int) (rebuild bool) {
	g := idf.gens[len(idf.gens)-1]
	if g.added >= g.capacity {
		capacity, added := 0, 0
		for _, g := range idf.gens {
			capacity += g.capacity
			added += g.added
		}
		if rebuild = added >= 2*stored || len(idf.gens) >= maxFilterGens; rebuild {
			capacity = g.capacity / 4
		}
		g = newBloomGen(max(idf.minIDs, capacity))
		idf.gens = append(idf.gens, g)
	}
	g.add(maphash.String(idf.seed, id), !idf.ready.Load())
	g.added++
	return rebuild
}

// certainlyNew reports whether id is certainly not stored: false means "look it up".
func (idf *idFilter) certainlyNew(id string) bool {
	if !idf.ready.Load() {
		return false
	}
	h := maphash.String(idf.seed, id)
	for _, g := range idf.gens {
		if g.mayContain(h) {
			return false
		}
	}
	return true
}
