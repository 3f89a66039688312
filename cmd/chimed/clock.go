//go:build !chimefault

package main

import (
	"net/http"
	"time"
)

// nodeClock is the clock a node fires and stamps events by. Production builds
// use the system clock and nothing else: the adjustable clock of the fault
// tests (clock_fault.go) exists only in builds with the chimefault tag.
func nodeClock() func() time.Time { return time.Now }

// registerFaultHandlers adds nothing outside fault-test builds.
func registerFaultHandlers(*http.ServeMux) {}
