package client

// HasClusterMap reports whether c's router holds a cluster map, so that a
// test can wait for the map rather than for time to pass.
func HasClusterMap(c *Client) bool {
	r := c.router
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.shardCount > 0
}
