//go:build !(cgo && linux)

package main

// Without cgo Pebble allocates in the Go heap, and elsewhere glibc's malloc
// is not in use: nothing to limit.
func limitMallocArenas() {}
