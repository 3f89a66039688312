package stale

import "example.com/stale/other"

// Tuning is the engine's configuration.
type Tuning struct {
	WheelHorizon int64
	other.Embedded
}

// Engine runs the loops.
type Engine struct {
	tuning Tuning
	lease  *lease
}

type lease struct{ mu chan struct{} }

func (l *lease) renew() {}

// defaultTuning is a variable of a type of the package.
var defaultTuning = Tuning{WheelHorizon: 1}

// Start starts the engine.
func (e *Engine) Start() { go e.horizonLoop() }

func (e *Engine) horizonLoop() {
	for pending := 0; pending < 1; pending++ {
	}
}

// Open returns an engine.
func Open() *Engine { return &Engine{tuning: defaultTuning} }
