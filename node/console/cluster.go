package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/auth"
	"github.com/chimehq/chime/shard/topiclimit"
)

// isAdmin reports whether s may change the cluster: an admin, or anyone
// on a node without an auth file. The API decides all the same.
func isAdmin(s *session) bool { return s.role == "" || s.role == auth.RoleAdmin }

// clusterAction drains a node, moves a shard's leadership, or replaces the
// topic rate limits: an admin's changes, each the chimectl command the page
// names.
func (c *Console) clusterAction(w http.ResponseWriter, r *http.Request, s *session) {
	if !isAdmin(s) {
		http.Error(w, fmt.Sprintf("%q is a %s: the cluster's controls are an admin's", s.name, s.role), http.StatusForbidden)
		return
	}
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	admin := chimev1.NewAdminClient(cl.Conn())
	var done string
	switch r.PathValue("action") {
	case "drain":
		node := r.PostForm.Get("node")
		if node == "" {
			c.fail(w, r, s, badInput("node: the id of the node to drain is required"))
			return
		}
		resp, err := admin.Drain(ctx, &chimev1.DrainRequest{Node: node})
		if err != nil {
			c.fail(w, r, s, err)
			return
		}
		done = fmt.Sprintf("draining %s: %d replicas and %d leaderships still on it", node, resp.GetReplicasRemaining(), resp.GetLeadersRemaining())
		if resp.GetSafeToStop() {
			done = fmt.Sprintf("%s is drained: it holds no replica and can be stopped", node)
		}
	case "transfer":
		shard, err := strconv.ParseUint(r.PostForm.Get("shard"), 10, 32)
		node := r.PostForm.Get("node")
		if err != nil || node == "" {
			c.fail(w, r, s, badInput("shard and node: a shard number and the id of one of its voters are required (got %q, %q)", r.PostForm.Get("shard"), node))
			return
		}
		resp, err := admin.TransferLeader(ctx, &chimev1.TransferLeaderRequest{Shard: uint32(shard), Node: node})
		if err != nil {
			c.fail(w, r, s, err)
			return
		}
		done = fmt.Sprintf("shard %d is led by %s", shard, resp.GetLeader())
	case "rate-limits":
		text := strings.Join(strings.Fields(strings.ReplaceAll(r.PostForm.Get("rules"), "\n", ",")), "")
		rules, err := topiclimit.Parse(strings.Trim(text, ","))
		if err != nil {
			c.fail(w, r, s, badInput("rules: %v", err))
			return
		}
		req := &chimev1.SetTopicRateLimitsRequest{}
		for _, rl := range rules {
			req.Limits = append(req.Limits, &chimev1.TopicRateLimit{Topic: rl.Pattern, PerSecond: rl.PerSecond})
		}
		if _, err := admin.SetTopicRateLimits(ctx, req); err != nil {
			c.fail(w, r, s, err)
			return
		}
		done = fmt.Sprintf("%d topic rate limits set on every live node", len(rules))
	default:
		http.NotFound(w, r)
		return
	}
	http.Redirect(w, r, "/ui/cluster?done="+url.QueryEscape(done), http.StatusSeeOther)
}

// rulesText writes a node's limits as the rate-limit form takes them, one
// TOPIC=N/s a line.
func rulesText(lim []*chimev1.TopicRateLimit) string {
	var b strings.Builder
	for _, l := range lim {
		fmt.Fprintf(&b, "%s=%s/s\n", l.GetTopic(), strconv.FormatFloat(l.GetPerSecond(), 'f', -1, 64))
	}
	return b.String()
}
