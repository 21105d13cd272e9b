package cli

// HTTP delivery's wiring into serve and work (package adapters/httpdelivery):
// the effect types that PGOUTBOX_HTTP_DELIVERY's file routes to the user's
// own HTTP endpoints, signed as Standard Webhooks, so a service in any
// language handles what it enqueued through the SQL API.

import (
	"context"
	"fmt"
	"os"

	"github.com/pgoutbox/pgoutbox/adapters/httpdelivery"
)

// httpDeliveryEnv names the configuration file of HTTP delivery.
const httpDeliveryEnv = "PGOUTBOX_HTTP_DELIVERY"

// httpDeliveryApp delivers the configured queues' types over HTTP. Unset:
// not started (logged). A configuration that cannot be used stops serve and
// work with the reason: effects would otherwise wait unserved in silence.
func httpDeliveryApp(_ context.Context, d appDeps) (*application, string, error) {
	path := os.Getenv(httpDeliveryEnv)
	if path == "" {
		return nil, httpDeliveryEnv + " is not set (HTTP delivery to your own endpoints: docs/any-language.md)", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", httpDeliveryEnv, err)
	}
	defer f.Close()
	c, err := httpdelivery.ReadConfig(f)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", httpDeliveryEnv, err)
	}
	p, err := c.Build(os.Getenv)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", httpDeliveryEnv, err)
	}
	for name, dl := range p.Deliverers {
		ep := dl.Endpoint()
		d.log.Info("HTTP delivery endpoint", "name", name, "concurrency", ep.Concurrency, "timeout", ep.Timeout)
	}
	return &application{name: "HTTP delivery", queues: p.Queues, types: p.Types}, "", nil
}
