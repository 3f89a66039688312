package other

// Thing is here.
func Thing() {}

// ThingDone is here.
const ThingDone = true

// Embedded is embedded in stale.Tuning.
type Embedded struct{ Promoted int }
