package checker

import (
	"slices"
	"strings"

	"github.com/chimehq/chime/cmd/internal/latency"
)

// faultPalette colours nemesis kinds, assigned in sorted kind order so both plots agree.
var faultPalette = []string{"#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00", "#a6761d", "#f781bf", "#999999", "#66c2a5", "#e7298a"}

func kindColors(ws []window) (map[string]string, []string) {
	var kinds []string
	for _, w := range ws {
		if !slices.Contains(kinds, w.kind) {
			kinds = append(kinds, w.kind)
		}
	}
	slices.Sort(kinds)
	m := make(map[string]string, len(kinds))
	for i, k := range kinds {
		m[k] = faultPalette[i%len(faultPalette)]
	}
	return m, kinds
}

// faultBands are the fault windows as the shaded bands of a plot whose x is seconds since
// startNs, in their kind's colour, with one legend entry per kind.
func faultBands(ws []window, startNs int64, kindColor map[string]string) []latency.Band {
	bands := make([]latency.Band, len(ws))
	for i, w := range ws {
		bands[i] = latency.Band{
			X0:     float64(w.start-startNs) / 1e9,
			X1:     float64(w.heal-startNs) / 1e9,
			Color:  kindColor[w.kind],
			Legend: "fault: " + w.kind,
			Title:  w.kind + " " + strings.Join(w.targets, ","),
		}
	}
	return bands
}
