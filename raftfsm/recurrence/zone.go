package recurrence

import (
	"archive/zip"
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"sync"
	"time"
)

//go:generate sh gen.sh

// zoneinfo is the IANA zone database, as the Go toolchain ships it: one
// compiled TZif file per zone name.
//
//go:embed zoneinfo.zip
var zoneinfo []byte

var zones struct {
	once  sync.Once
	files map[string]*zip.File
	err   error

	mu     sync.Mutex
	loaded map[string]*time.Location
}

// LoadZone returns the zone named name from the embedded database, never
// from the host's. "" and "UTC" are UTC. A name the database does not hold
// is an error; so is "Local", which names the host's zone.
func LoadZone(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	zones.once.Do(func() {
		r, err := zip.NewReader(bytes.NewReader(zoneinfo), int64(len(zoneinfo)))
		if err != nil {
			zones.err = fmt.Errorf("recurrence: embedded zone database: %w", err)
			return
		}
		zones.files = make(map[string]*zip.File, len(r.File))
		for _, f := range r.File {
			zones.files[f.Name] = f
		}
		zones.loaded = make(map[string]*time.Location)
	})
	if zones.err != nil {
		return nil, zones.err
	}
	zones.mu.Lock()
	defer zones.mu.Unlock()
	if loc, ok := zones.loaded[name]; ok {
		return loc, nil
	}
	f, ok := zones.files[name]
	if !ok {
		return nil, fmt.Errorf("%q is not an IANA time zone name (such as Europe/Paris or America/New_York) in tzdata %s", name, TZDataVersion)
	}
	rc, err := f.Open()
	if err != nil {
		return nil, fmt.Errorf("recurrence: zone %q: %w", name, err)
	}
	defer func() { _ = rc.Close() }() // read only: a read error is what matters
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("recurrence: zone %q: %w", name, err)
	}
	loc, err := time.LoadLocationFromTZData(name, data)
	if err != nil {
		return nil, fmt.Errorf("recurrence: zone %q: %w", name, err)
	}
	zones.loaded[name] = loc
	return loc, nil
}

// zoneBounds is t.ZoneBounds with one flaw of it mended. Past a zone's
// last listed transition, Go derives the offset from the zone's POSIX rule
// one UTC year at a time and reports the year's end as a bound, taking
// every year to be 365 days long: in the last day of a leap year the end
// it reports is at or before t. No transition is there (the offset is the
// same on both sides of a year's end), so the period is taken to run to
// the real end of the year.
func zoneBounds(t time.Time) (start, end time.Time) {
	start, end = t.ZoneBounds()
	if !end.IsZero() && !end.After(t) {
		end = time.Date(t.UTC().Year()+1, time.January, 1, 0, 0, 0, 0, time.UTC).In(t.Location())
	}
	return start, end
}
