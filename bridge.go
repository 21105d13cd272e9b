package pgoutbox

import (
	"time"

	"github.com/pgoutbox/pgoutbox/internal/core"
)

// The engine of a broker consumer (adapters/nats) is internal/core's, as the
// Client's is; this gives it the root's job building and classification.
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
