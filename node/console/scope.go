package console

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/chimehq/chime/rpc/auth"
)

// startWithin sends a person whose credential is limited to id prefixes or
// topics, opening a list (events or recurring schedules) with no filter at
// all, to the same list filtered to what the credential may see. The API
// refuses such a credential any query beyond its grant, and an unfiltered
// list is one: without this, the page the sign-in lands on, and the nav's
// links, showed that refusal and no search box. The filter is the grant's
// first id prefix and, with topics (events only: schedules are listed by
// id), its topic when it names exactly one (a pattern is not a topic a
// filter can name); the page shows it in its form, to change. A filter the
// person chose is never rewritten.
func (c *Console) startWithin(h handler, topics bool) handler {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		if r.URL.RawQuery != "" || c.cfg.Auth == nil || s.name == "" {
			h(w, r, s)
			return
		}
		g := c.cfg.Auth.Grant(s.name)
		if g == nil || g.Role == auth.RoleAdmin {
			h(w, r, s)
			return
		}
		q := url.Values{}
		if len(g.IDPrefixes) > 0 {
			q.Set("q", g.IDPrefixes[0])
		}
		if topics && len(g.Topics) == 1 && !strings.ContainsAny(g.Topics[0], `*?[\`) {
			q.Set("topic", g.Topics[0])
		}
		if len(q) == 0 {
			h(w, r, s)
			return
		}
		http.Redirect(w, r, r.URL.Path+"?"+q.Encode(), http.StatusSeeOther)
	}
}
