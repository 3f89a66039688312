package latency

import (
	"math"
	"slices"
)

// Quantile returns the q-quantile (0 < q <= 1) of xs by nearest rank: the value at rank
// ceil(q*n) (1-based) of the n sorted values, so p50 of 1..100 is 50, p99 is 99 and q=1 is the
// max; 0 when xs is empty. It sorts xs in place unless xs is already sorted, so that asking
// several quantiles of one slice sorts it once.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	if !slices.IsSorted(xs) {
		slices.Sort(xs)
	}
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}
