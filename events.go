package pgoutbox

import "sync"

// Event reports a delivery's recorded outcome. It is sent after the outcome
// was written to the database (or, for OutcomeLeaseLost, after the write
// matched no row).
type Event struct {
	// EffectID is the effect's id (what Enqueue returned).
	EffectID int64
	// Queue is the effect's queue.
	Queue string
	// Type is the effect's type.
	Type string
	// Attempt is the delivery's attempt number (Delivery.Attempt, from 1).
	Attempt int
	// Outcome is how the delivery ended.
	Outcome Outcome
	// State is the effect's state after the outcome: StateCompleted,
	// StateAvailable (a retry), StateDeadLetter or
	// StateReconciliationRequired; empty when the lease was lost or the
	// write failed.
	State State
	// Err is the handler's error text; empty on success.
	Err string
}

// subscribers fans events out to Subscribe channels.
type subscribers struct {
	mu   sync.Mutex
	next int
	subs map[int]chan Event
}

// Subscribe returns a channel of every outcome this client records, and a
// function that ends the subscription. An event that does not fit in the
// channel's buffer (size buffer) is dropped, so a slow subscriber never
// slows delivery.
func (c *Client) Subscribe(buffer int) (<-chan Event, func()) {
	ch := make(chan Event, buffer)
	c.subs.mu.Lock()
	defer c.subs.mu.Unlock()
	if c.subs.subs == nil {
		c.subs.subs = map[int]chan Event{}
	}
	id := c.subs.next
	c.subs.next++
	c.subs.subs[id] = ch
	return ch, func() {
		c.subs.mu.Lock()
		defer c.subs.mu.Unlock()
		delete(c.subs.subs, id)
	}
}

func (c *Client) emit(e Event) {
	c.subs.mu.Lock()
	defer c.subs.mu.Unlock()
	for _, ch := range c.subs.subs {
		select {
		case ch <- e:
		default:
			c.log.Warn("subscriber channel full; event dropped", "effect_id", e.EffectID)
		}
	}
}
