//go:build chimefault

package main

import (
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Builds with the chimefault tag (go build -tags chimefault, as
// cmd/chime-jepsen does) let the fault-test driver skew a node's clock: every
// time the node fires by, stamps or resolves a delay with is the system
// clock plus an offset set over the HTTP port. Raft's own timers are
// unaffected, as they would be by a real wall-clock step.

var clockOffset atomic.Int64 // nanoseconds

func nodeClock() func() time.Time {
	return func() time.Time { return time.Now().Add(time.Duration(clockOffset.Load())) }
}

// registerFaultHandlers serves /debug/fault/clock-offset: GET prints the
// offset in ns, POST ?ns=N sets it.
func registerFaultHandlers(mux *http.ServeMux) {
	mux.HandleFunc("/debug/fault/clock-offset", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			ns, err := strconv.ParseInt(r.URL.Query().Get("ns"), 10, 64)
			if err != nil {
				http.Error(w, "ns: "+err.Error(), http.StatusBadRequest)
				return
			}
			clockOffset.Store(ns)
		}
		fmt.Fprintln(w, clockOffset.Load())
	})
}
