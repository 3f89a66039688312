package latency

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestQuantile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct{ q, want float64 }{{0.5, 5}, {0.9, 9}, {0.99, 10}, {1, 10}, {0.01, 1}} {
		if got := Quantile(xs, c.q); got != c.want {
			t.Errorf("Quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if Quantile(nil, 0.5) != 0 {
		t.Error("Quantile of nothing is not 0")
	}
}

// TestPlotDownsample: a plot of 120k dots draws at most MaxPoints, keeps a rare class
// whole, and still draws the common one densely.
func TestPlotDownsample(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	common := Series{Name: "first copy", Color: "#00f", Radius: 1}
	for range 120000 {
		common.Points = append(common.Points, Point{X: r.Float64() * 600, Y: r.ExpFloat64() * 20})
	}
	rare := Series{Name: "early", Color: "#f00", Radius: 2}
	for i := range 37 {
		rare.Points = append(rare.Points, Point{X: float64(i) * 10, Y: -float64(i + 3)})
	}
	var b strings.Builder
	Render(&b, Plot{ID: "p", Title: "t", Series: []Series{common, rare},
		Bands: []Band{{X0: 100, X1: 110, Color: "#e41a1c", Legend: "fault: kill", Title: "kill n1"}}})
	drawn := map[string]int{}
	for _, m := range regexp.MustCompile(`data-series="([^"]*)" data-points="(\d+)" data-total="(\d+)"`).FindAllStringSubmatch(b.String(), -1) {
		n, _ := strconv.Atoi(m[2])
		drawn[m[1]] = n
		if got := strings.Count(b.String(), "h0"); got < n {
			t.Fatalf("path has %d dots, attribute says %d", got, n)
		}
	}
	if total := drawn["first copy"] + drawn["early"]; total > MaxPoints || total < MaxPoints*9/10 {
		t.Errorf("drew %d dots, want close to and at most %d", total, MaxPoints)
	}
	if drawn["early"] != 37 {
		t.Errorf("drew %d early dots, want all 37", drawn["early"])
	}
	if size := b.Len(); size > 600_000 {
		t.Errorf("plot is %d bytes", size)
	}
	for _, want := range []string{">fault: kill<", "<title>kill n1: 100.000s–110.000s</title>", `class="faults"`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the band is not drawn: no %q", want)
		}
	}
}
