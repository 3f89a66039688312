package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/chimehq/chime/client"
)

func forecastCommand() *command {
	return &command{
		name:    "forecast",
		summary: "count the pending events due per minute, hour and day ahead",
		about: `Forecast prints how many pending events fall due per minute for the next
hour, per hour for the next day and per day (UTC) for the next 31 days,
across every shard, with how many are overdue (due before this minute and
still pending) and the earliest and latest due time of any. Each range
starts on the minute, hour or day now is in; ranges with no event are left
out of the text (--json has them all). Every replica counts its shard's
pending events by due minute in memory, so a forecast reads no event and
costs the same however many are pending. It counts every event: a
credential limited to some topics or id prefixes is refused, and counts its
own with count --due-after --due-before.`,
		example: `  chimectl forecast
  chimectl forecast --json`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			stale := fs.Bool("stale", false, "let any replica answer, possibly a little behind the leaders")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("forecast takes no arguments, got %q", args)
				}
				q := client.ForecastAhead(c.now())
				q.StaleOK = *stale
				var fc client.Forecast
				err := c.call(ctx, func(ctx context.Context, cl *client.Client) (err error) {
					fc, err = cl.Forecast(ctx, q)
					return err
				})
				if err != nil {
					return err
				}
				return c.printForecast(fc)
			}
		},
	}
}

// forecastNames names the series of client.ForecastAhead, in order.
var forecastNames = []string{"minute", "hour", "day"}

func (c *cli) printForecast(fc client.Forecast) error {
	if c.json {
		type rangeJSON struct {
			From  time.Time `json:"from"`
			Count int64     `json:"count"`
		}
		type seriesJSON struct {
			Per    string      `json:"per"`
			Ranges []rangeJSON `json:"ranges"`
		}
		out := struct {
			Pending  int64        `json:"pending"`
			Overdue  int64        `json:"overdue"`
			Earliest *time.Time   `json:"earliest_due,omitempty"`
			Latest   *time.Time   `json:"latest_due,omitempty"`
			Series   []seriesJSON `json:"series"`
		}{Pending: fc.Pending, Overdue: fc.DueBefore, Series: []seriesJSON{}}
		if fc.Pending > 0 {
			out.Earliest, out.Latest = &fc.EarliestDue, &fc.LatestDue
		}
		for i, s := range fc.Series {
			sj := seriesJSON{Per: forecastNames[min(i, len(forecastNames)-1)], Ranges: []rangeJSON{}}
			for j, n := range s.Counts {
				sj.Ranges = append(sj.Ranges, rangeJSON{From: s.At(j).UTC(), Count: n})
			}
			out.Series = append(out.Series, sj)
		}
		return c.printJSON(out)
	}
	now := c.now()
	facts := [][]string{{"pending", strconv.FormatInt(fc.Pending, 10)}, {"overdue", strconv.FormatInt(fc.DueBefore, 10)}}
	if fc.Pending > 0 {
		facts = append(facts,
			[]string{"earliest", fc.EarliestDue.In(c.loc).Format(time.RFC3339) + " (" + relative(fc.EarliestDue.Sub(now).Round(time.Second)) + ")"},
			[]string{"latest", fc.LatestDue.In(c.loc).Format(time.RFC3339) + " (" + relative(fc.LatestDue.Sub(now).Round(time.Second)) + ")"})
	}
	for _, f := range facts {
		if _, err := fmt.Fprintf(c.stdout, "%-9s %s\n", f[0], f[1]); err != nil {
			return err
		}
	}
	layouts := []string{"15:04", "Jan 02 15:04", "2006-01-02"}
	for i, s := range fc.Series {
		name := forecastNames[min(i, len(forecastNames)-1)]
		var rows [][]string
		var total int64
		for j, n := range s.Counts {
			total += n
			if n > 0 {
				at := s.At(j).In(c.loc)
				if name == "day" {
					at = s.At(j).UTC()
				}
				rows = append(rows, []string{at.Format(layouts[min(i, len(layouts)-1)]), strconv.FormatInt(n, 10)})
			}
		}
		if _, err := fmt.Fprintf(c.stdout, "\nper %s from %s: %d due\n", name, s.Start.In(c.loc).Format(time.RFC3339), total); err != nil {
			return err
		}
		if len(rows) > 0 {
			if err := table(c.stdout, []string{"FROM", "DUE"}, rows); err != nil {
				return err
			}
		}
	}
	return nil
}
