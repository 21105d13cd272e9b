package pgoutbox

import (
	"time"

	"github.com/pgoutbox/pgoutbox/internal/core"
)

// internal/core's tests deliver through the root's job building and
// classification; everything outside the root delivers through the public
// API instead (Lease.Deliver).
func init() {
	core.Provide(core.Bridge[EffectType, Delivery]{
		Job: jobOf,
		Route: func(backoffCap time.Duration) func(error, bool, int) core.Route {
			return func(herr error, replaySafe bool, attempt int) core.Route {
				return routeOf(herr, replaySafe, attempt, backoffCap)
			}
		},
		Transient: transient,
	})
}
