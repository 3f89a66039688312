package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard/topiclimit"
)

func rateLimitCommand() *command {
	return &command{
		name:    "rate-limit",
		summary: "show or change the per-topic fire rate limits of every node",
		args:    "get | set RULES",
		about: `Rate-limit get shows the per-topic fire rate limits each live node enforces.
Rate-limit set replaces them on every live node at once: RULES is what
chimed --topic-rate-limit takes, comma-separated TOPIC=N/s (or N/m, N/h),
TOPIC a topic name or a glob such as billing.*; a topic takes the first rule
that matches it, and the records of the topics a rule matches share its rate
across the cluster. An empty RULES ('') removes every limit.

Each shard's leader produces at most its share (the rate divided by the
shard count) of a rule's records a second; records over it wait in the
timing wheel, highest priority first, and the lateness they get is
reported in chime_fire_rate_limited_lateness_seconds, apart from
chime_fire_lateness_seconds. A change lasts until a node restarts, when its
--topic-rate-limit applies again: change that too to keep it. A node that
could not be reached is listed with its error and keeps its limits.`,
		example: `  chimectl rate-limit get
  chimectl rate-limit set 'reports=5000/s,billing.*=1000/s'
  chimectl rate-limit set ''`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error {
				if len(args) == 0 {
					return usagef("give an action: get or set RULES")
				}
				var resp *chimev1.TopicRateLimitsResponse
				var err error
				switch args[0] {
				case "get":
					if len(args) != 1 {
						return usagef("rate-limit get takes no argument, got %q", args[1:])
					}
					err = c.readAdmin(ctx, func(ctx context.Context, ac chimev1.AdminClient) error {
						resp, err = ac.GetTopicRateLimits(ctx, &chimev1.GetTopicRateLimitsRequest{})
						return err
					})
				case "set":
					if len(args) != 2 {
						return usagef("rate-limit set wants the rules as one argument (quote them; '' removes every limit), got %d arguments", len(args)-1)
					}
					rules, perr := topiclimit.Parse(args[1])
					if perr != nil {
						return usagef("%v", perr)
					}
					req := &chimev1.SetTopicRateLimitsRequest{}
					for _, r := range rules {
						req.Limits = append(req.Limits, &chimev1.TopicRateLimit{Topic: r.Pattern, PerSecond: r.PerSecond})
					}
					err = c.callAdmin(ctx, func(ctx context.Context, ac chimev1.AdminClient) error {
						resp, err = ac.SetTopicRateLimits(ctx, req)
						return err
					})
				default:
					return usagef("unknown action %q: get or set RULES", args[0])
				}
				if err != nil {
					return err
				}
				return c.printRateLimits(resp)
			}
		},
	}
}

// printRateLimits shows each node's rules, and fails (exit 1) if a node
// could not be reached.
func (c *cli) printRateLimits(resp *chimev1.TopicRateLimitsResponse) error {
	unreached := 0
	type nodeJSON struct {
		Node   string   `json:"node"`
		Limits []string `json:"limits"`
		Error  string   `json:"error,omitempty"`
	}
	var nodes []nodeJSON
	for _, n := range resp.GetNodes() {
		var rules topiclimit.Rules
		for _, l := range n.GetLimits() {
			rules = append(rules, topiclimit.Rule{Pattern: l.GetTopic(), PerSecond: l.GetPerSecond()})
		}
		j := nodeJSON{Node: n.GetNode(), Limits: []string{}, Error: n.GetError()}
		for _, r := range rules {
			j.Limits = append(j.Limits, topiclimit.Rules{r}.String())
		}
		nodes = append(nodes, j)
		if n.GetError() != "" {
			unreached++
		}
	}
	if c.json {
		if err := c.printJSON(nodes); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tLIMITS")
		for _, n := range nodes {
			text := strings.Join(n.Limits, ",")
			switch {
			case n.Error != "":
				text = "unreachable: " + n.Error
			case text == "":
				text = "(none)"
			}
			fmt.Fprintf(tw, "%s\t%s\n", n.Node, text)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if unreached > 0 {
		return fmt.Errorf("%s of %d nodes could not be reached", strconv.Itoa(unreached), len(nodes))
	}
	return nil
}
