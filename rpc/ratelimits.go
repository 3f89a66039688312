package rpc

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/cluster"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard/topiclimit"
)

// GetTopicRateLimits gathers the limits of every live node; a forwarded
// call answers for this node alone.
func (a *Admin) GetTopicRateLimits(ctx context.Context, _ *chimev1.GetTopicRateLimitsRequest) (*chimev1.TopicRateLimitsResponse, error) {
	return a.eachNode(ctx, a.localLimits, func(ctx context.Context, cl chimev1.AdminClient) (*chimev1.TopicRateLimitsResponse, error) {
		return cl.GetTopicRateLimits(ctx, &chimev1.GetTopicRateLimitsRequest{})
	}), nil
}

// SetTopicRateLimits checks the rules, then sets them on every live node
// (on this node alone when forwarded).
func (a *Admin) SetTopicRateLimits(ctx context.Context, req *chimev1.SetTopicRateLimitsRequest) (*chimev1.TopicRateLimitsResponse, error) {
	rules := make(topiclimit.Rules, 0, len(req.Limits))
	for i, l := range req.Limits {
		r := topiclimit.Rule{Pattern: l.Topic, PerSecond: l.PerSecond}
		// Parse holds the rules to one syntax and one set of checks.
		if _, err := topiclimit.Parse(topiclimit.Rules{r}.String()); err != nil || l.Topic == "" {
			if err == nil {
				err = fmt.Errorf("a topic name or pattern is required")
			}
			return nil, status.Errorf(codes.InvalidArgument, "limits[%d]: %v", i, err)
		}
		rules = append(rules, r)
	}
	if _, err := topiclimit.Parse(rules.String()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "limits: %v", err)
	}
	set := func() *chimev1.TopicRateLimitsResponse {
		a.limits.Set(rules)
		a.logger.Info("topic rate limits set", "limits", rules.String())
		return a.localLimits()
	}
	return a.eachNode(ctx, set, func(ctx context.Context, cl chimev1.AdminClient) (*chimev1.TopicRateLimitsResponse, error) {
		return cl.SetTopicRateLimits(ctx, req)
	}), nil
}

// localLimits is this node's entry.
func (a *Admin) localLimits() *chimev1.TopicRateLimitsResponse {
	n := &chimev1.NodeTopicRateLimits{Node: a.c.Self()}
	for _, r := range a.limits.Rules() {
		n.Limits = append(n.Limits, &chimev1.TopicRateLimit{Topic: r.Pattern, PerSecond: r.PerSecond})
	}
	return &chimev1.TopicRateLimitsResponse{Nodes: []*chimev1.NodeTopicRateLimits{n}}
}

// eachNode answers with local() for this node and, unless the call was
// forwarded to it (or it runs alone), with remote, forwarded, for every
// other live node, each in its entry; a node that fails is reported in its
// entry.
func (a *Admin) eachNode(ctx context.Context, local func() *chimev1.TopicRateLimitsResponse, remote func(context.Context, chimev1.AdminClient) (*chimev1.TopicRateLimitsResponse, error)) *chimev1.TopicRateLimitsResponse {
	if cluster.Forwarded(ctx) || a.c.Alone() {
		return local()
	}
	var ids []string
	for id, m := range a.c.View().Members {
		if m.State.Live() && !a.c.Removed(id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]*chimev1.NodeTopicRateLimits, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		if id == a.c.Self() {
			out[i] = local().Nodes[0]
			continue
		}
		wg.Go(func() {
			cl, err := a.adminClient(id)
			if err == nil {
				var resp *chimev1.TopicRateLimitsResponse
				if resp, err = remote(cluster.ForwardContext(ctx, nil), cl); err == nil && len(resp.Nodes) == 1 {
					out[i] = resp.Nodes[0]
					return
				}
			}
			out[i] = &chimev1.NodeTopicRateLimits{Node: id, Error: fmt.Sprint(err)}
		})
	}
	wg.Wait()
	return &chimev1.TopicRateLimitsResponse{Nodes: out}
}
