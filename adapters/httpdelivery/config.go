package httpdelivery

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// MaxConfigBytes bounds a configuration file (1 MiB).
const MaxConfigBytes = 1 << 20

// Config is what `pgoutbox serve` and `work` read from the file named by
// PGOUTBOX_HTTP_DELIVERY: the endpoints, and which effect types of which
// queues go to each. Only configured types are delivered; a payload never
// chooses where it goes.
//
//	{
//	  "endpoints": {
//	    "emails-service": {"url": "http://127.0.0.1:3000/hooks/pgoutbox", "secret_env": "EMAILS_HOOK_SECRET",
//	                       "concurrency": 8, "timeout": "10s"}
//	  },
//	  "types": [
//	    {"queue": "emails", "type": "email.receipt", "endpoint": "emails-service", "replay_safe": true}
//	  ]
//	}
type Config struct {
	// Endpoints by name.
	Endpoints map[string]EndpointConfig `json:"endpoints"`
	// Types lists each delivered effect type.
	Types []TypeConfig `json:"types"`
}

// EndpointConfig is one endpoint of a Config. The secret comes from exactly
// one of SecretEnv (the name of an environment variable) and SecretFile (a
// file's path), never from the configuration itself.
type EndpointConfig struct {
	URL         string   `json:"url"`
	SecretEnv   string   `json:"secret_env,omitempty"`
	SecretFile  string   `json:"secret_file,omitempty"`
	Concurrency int      `json:"concurrency,omitempty"`
	Timeout     Duration `json:"timeout,omitempty"`
}

// TypeConfig routes one effect type of one queue to an endpoint.
type TypeConfig struct {
	Queue    string `json:"queue"`
	Type     string `json:"type"`
	Endpoint string `json:"endpoint"`
	// ReplaySafe says the endpoint deduplicates by webhook-id, so the
	// effect may be delivered more than once; false (the default) gives
	// the type the reconciliation rule: an unknown outcome is never sent
	// again blindly.
	ReplaySafe bool `json:"replay_safe"`
	// OrderingMovesOn is pgoutbox.EffectType.OrderingMovesOn.
	OrderingMovesOn bool `json:"ordering_moves_on,omitempty"`
}

// Duration is a time.Duration written as Go writes one ("10s", "1m30s").
type Duration time.Duration

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New(`a duration is a string such as "10s"`)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// ReadConfig reads a Config from r: at most MaxConfigBytes, one JSON object,
// no unknown fields.
func ReadConfig(r io.Reader) (Config, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxConfigBytes+1))
	if err != nil {
		return Config{}, err
	}
	if len(b) > MaxConfigBytes {
		return Config{}, fmt.Errorf("httpdelivery: the configuration is over %d bytes", MaxConfigBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("httpdelivery: configuration: %w", err)
	}
	if dec.More() {
		return Config{}, errors.New("httpdelivery: configuration: more than one JSON value")
	}
	return c, nil
}

// Plan is a Config made ready to run: the Deliverers and what the engine
// must register.
type Plan struct {
	// Deliverers by endpoint name.
	Deliverers map[string]*Deliverer
	// Queues are the queues to work (the engine's defaults).
	Queues map[string]pgoutbox.QueueConfig
	// Types are the effect types to register, each delivered over HTTP.
	Types []pgoutbox.EffectType
}

// Build checks c, reads each endpoint's secret (getenv, os.ReadFile) and
// returns the Plan. Every problem is named; none quotes a secret.
func (c Config) Build(getenv func(string) string) (*Plan, error) {
	if len(c.Types) == 0 {
		return nil, errors.New("httpdelivery: configuration: no types")
	}
	p := &Plan{Deliverers: map[string]*Deliverer{}, Queues: map[string]pgoutbox.QueueConfig{}}
	for _, name := range slices.Sorted(maps.Keys(c.Endpoints)) {
		ec := c.Endpoints[name]
		secret, err := ec.secret(name, getenv)
		if err != nil {
			return nil, err
		}
		d, err := New(Endpoint{Name: name, URL: ec.URL, Secret: secret, Concurrency: ec.Concurrency,
			Timeout: time.Duration(ec.Timeout)}, nil)
		if err != nil {
			return nil, err
		}
		p.Deliverers[name] = d
	}
	seen := map[string]bool{}
	for i, t := range c.Types {
		if t.Queue == "" || t.Type == "" {
			return nil, fmt.Errorf("httpdelivery: configuration: types[%d] needs a queue and a type", i)
		}
		d, ok := p.Deliverers[t.Endpoint]
		if !ok {
			return nil, fmt.Errorf("httpdelivery: configuration: types[%d] (%s) names no configured endpoint %q", i, t.Type, t.Endpoint)
		}
		if seen[t.Type] {
			return nil, fmt.Errorf("httpdelivery: configuration: type %s is listed twice (a type has one handler)", t.Type)
		}
		seen[t.Type] = true
		p.Queues[t.Queue] = pgoutbox.QueueConfig{}
		p.Types = append(p.Types, pgoutbox.EffectType{Name: t.Type, ReplaySafe: t.ReplaySafe,
			OrderingMovesOn: t.OrderingMovesOn, Handler: d.Handler()})
	}
	return p, nil
}

// secret reads the endpoint's secret from exactly one of its sources.
func (ec EndpointConfig) secret(name string, getenv func(string) string) (string, error) {
	switch {
	case (ec.SecretEnv == "") == (ec.SecretFile == ""):
		return "", fmt.Errorf("httpdelivery: endpoint %s: set exactly one of secret_env and secret_file", name)
	case ec.SecretEnv != "":
		v := getenv(ec.SecretEnv)
		if v == "" {
			return "", fmt.Errorf("httpdelivery: endpoint %s: %s is not set", name, ec.SecretEnv)
		}
		return v, nil
	default:
		b, err := os.ReadFile(ec.SecretFile)
		if err != nil {
			return "", fmt.Errorf("httpdelivery: endpoint %s: secret_file: %w", name, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
}
