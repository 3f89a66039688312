//go:build cgo && linux

package main

// #include <malloc.h>
import "C"

import "os"

// mallocArenas is how many arenas glibc's malloc may use, unless the
// MALLOC_ARENA_MAX environment variable says otherwise.
//
// Built with cgo, Pebble allocates its block cache and memtables with C
// malloc. glibc gives a thread that allocates while another holds an arena
// an arena of its own, up to eight per core, and a freed cache block stays
// in the arena it came from; with Go's threads moving between goroutines,
// each arena ends up holding a share of the cache's turnover. A node holding
// 100 million pending events (GOMEMLIMIT=512MiB) was at 1,071 MB resident
// two minutes after a restart, with 276 MB of Pebble memory and 509 MB of
// Go memory; with two arenas, at 660 MB.
const mallocArenas = 2

func limitMallocArenas() {
	if os.Getenv("MALLOC_ARENA_MAX") == "" {
		C.mallopt(C.M_ARENA_MAX, mallocArenas)
	}
}
