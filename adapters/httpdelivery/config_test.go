package httpdelivery_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/adapters/httpdelivery"
)

func TestConfigBuild(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SVC_SECRET": secret}
	getenv := func(k string) string { return env[k] }
	good := `{"endpoints": {"a": {"url": "http://127.0.0.1:1/h", "secret_env": "SVC_SECRET", "concurrency": 3, "timeout": "2s"},
	                        "b": {"url": "https://b.example/h", "secret_file": "` + file + `"}},
	          "types": [{"queue": "emails", "type": "email.send", "endpoint": "a", "replay_safe": true},
	                    {"queue": "emails", "type": "email.once", "endpoint": "b"}]}`
	c, err := httpdelivery.ReadConfig(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Build(getenv)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Types) != 2 || !p.Types[0].ReplaySafe || p.Types[1].ReplaySafe || p.Types[0].Handler == nil || len(p.Queues) != 1 {
		t.Fatalf("plan: %+v", p)
	}
	if ep := p.Deliverers["a"].Endpoint(); ep.Concurrency != 3 || ep.Timeout.String() != "2s" {
		t.Errorf("endpoint a: %+v", ep)
	}
	if ep := p.Deliverers["b"].Endpoint(); ep.Concurrency != httpdelivery.ConcurrencyDefault || ep.Timeout != httpdelivery.TimeoutDefault {
		t.Errorf("endpoint b's defaults: %+v", ep)
	}
	for name, bad := range map[string]string{
		"unknown field":    `{"endpoints": {}, "types": [], "url": "x"}`,
		"no types":         `{"endpoints": {"a": {"url": "http://x", "secret_env": "SVC_SECRET"}}, "types": []}`,
		"no endpoint":      `{"endpoints": {}, "types": [{"queue": "q", "type": "t", "endpoint": "nope"}]}`,
		"two secrets":      `{"endpoints": {"a": {"url": "http://x", "secret_env": "SVC_SECRET", "secret_file": "f"}}, "types": [{"queue": "q", "type": "t", "endpoint": "a"}]}`,
		"unset secret":     `{"endpoints": {"a": {"url": "http://x", "secret_env": "UNSET"}}, "types": [{"queue": "q", "type": "t", "endpoint": "a"}]}`,
		"type twice":       `{"endpoints": {"a": {"url": "http://x", "secret_env": "SVC_SECRET"}}, "types": [{"queue": "q", "type": "t", "endpoint": "a"}, {"queue": "r", "type": "t", "endpoint": "a"}]}`,
		"bad duration":     `{"endpoints": {"a": {"url": "http://x", "secret_env": "SVC_SECRET", "timeout": 5}}, "types": [{"queue": "q", "type": "t", "endpoint": "a"}]}`,
		"two values":       `{"endpoints": {}, "types": []} {}`,
		"secret in config": `{"endpoints": {"a": {"url": "http://x", "secret": "` + secret + `"}}, "types": [{"queue": "q", "type": "t", "endpoint": "a"}]}`,
		"too large":        `{"endpoints": {}, "types": [], "pad": "` + strings.Repeat("x", httpdelivery.MaxConfigBytes) + `"}`,
	} {
		c, err := httpdelivery.ReadConfig(strings.NewReader(bad))
		if err == nil {
			_, err = c.Build(getenv)
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), secret[6:]) {
			t.Errorf("%s: the error quotes the secret: %v", name, err)
		}
	}
}
