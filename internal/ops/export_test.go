package ops

import "time"

// SetTook makes the cache believe its last query ran for d (StatsPause).
func (c *StatsCache) SetTook(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.took = d
}
