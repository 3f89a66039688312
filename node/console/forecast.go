package console

import (
	"net/http"
	"time"

	"github.com/chimehq/chime/client"
)

// forecastRefresh is how often the forecast page reloads itself (an HTTP
// Refresh header, which needs no JavaScript). Each shard answers a
// forecast from its counts by due minute, so a reload costs the same
// however many events are pending.
const forecastRefresh = "10"

// forecastRange is one range of a forecast table.
type forecastRange struct {
	From  string
	Count int64
}

// forecastView is one series of the page: its non-empty ranges, its total
// and its chart.
type forecastView struct {
	Name   string
	Total  int64
	Ranges []forecastRange
}

func (c *Console) forecastPage(w http.ResponseWriter, r *http.Request, s *session) {
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	now := c.cfg.Now()
	q := client.ForecastAhead(now)
	start := time.Now()
	fc, err := cl.Forecast(ctx, q)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	took := time.Since(start).Round(time.Millisecond)
	names := []string{"Next hour, per minute", "Next day, per hour", "Next 31 days, per day (UTC)"}
	layouts := []string{"15:04 MST", "Jan 02 15:04 MST", "Mon Jan 02"}
	var views []forecastView
	var charts []chartData
	for i, sc := range fc.Series {
		v := forecastView{Name: names[min(i, len(names)-1)]}
		ch := chartData{Title: v.Name, At: make([]int64, 0, len(sc.Counts))}
		due := chartSeries{Label: "due", Unit: "events", Bars: true, Values: make([]*float64, 0, len(sc.Counts))}
		for j, n := range sc.Counts {
			at := sc.At(j).UTC()
			v.Total += n
			if n > 0 {
				v.Ranges = append(v.Ranges, forecastRange{From: at.Format(layouts[min(i, len(layouts)-1)]), Count: n})
			}
			f := float64(n)
			ch.At, due.Values = append(ch.At, at.Unix()), append(due.Values, &f)
		}
		ch.Series = []chartSeries{due}
		views = append(views, v)
		charts = append(charts, ch)
	}
	data := map[string]any{
		"F": fc, "Series": views, "Charts": charts, "Took": took,
		"Now": now.UTC().Format("2006-01-02 15:04:05 MST"),
	}
	if fc.Pending > 0 {
		data["Earliest"], data["EarliestIn"] = fc.EarliestDue.UTC().Format("2006-01-02 15:04:05.000 MST"), relative(fc.EarliestDue, now)
		data["Latest"], data["LatestIn"] = fc.LatestDue.UTC().Format("2006-01-02 15:04:05.000 MST"), relative(fc.LatestDue, now)
	}
	w.Header().Set("Refresh", forecastRefresh)
	c.render(w, r, s, "forecast", http.StatusOK, data)
}
