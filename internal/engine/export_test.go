package engine

// Queued is the number of completions waiting for a group-commit worker.
func (c *Committer) Queued() int { return len(c.reqs) }
