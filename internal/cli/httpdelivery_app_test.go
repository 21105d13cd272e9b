package cli_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/httpdelivery"
	"github.com/pgoutbox/pgoutbox/internal/cli"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// hookSecret is the Standard Webhooks specification's example secret.
const hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// TestWorkDeliversOverHTTP: `pgoutbox work` with PGOUTBOX_HTTP_DELIVERY
// delivers the configured type to the endpoint, signed, and the effect
// completes; nothing else of the queue is claimed. Sequential: it sets the
// environment, which the parallel tests of the package do not see (they
// resume after it).
func TestWorkDeliversOverHTTP(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key, err := httpdelivery.ParseSecret(hookSecret)
	if err != nil {
		t.Fatal(err)
	}
	var verified, refused atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ts, _ := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
		if r.Header.Get("webhook-signature") != httpdelivery.Sign(key, r.Header.Get("webhook-id"), ts, body) {
			refused.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		verified.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	conf := filepath.Join(t.TempDir(), "http-delivery.json")
	if err := os.WriteFile(conf, []byte(`{"endpoints": {"mailer": {"url": "`+srv.URL+`/hooks", "secret_env": "MAILER_HOOK_SECRET"}},
		"types": [{"queue": "emails", "type": "email.receipt", "endpoint": "mailer", "replay_safe": true}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGOUTBOX_HTTP_DELIVERY", conf)
	t.Setenv("MAILER_HOOK_SECRET", hookSecret)
	var ids []int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = pgoutbox.EnqueueBatch(ctx, tx, []pgoutbox.Effect{
			{Queue: "emails", Type: "email.receipt", Key: "r1", Payload: map[string]any{"order": 1}},
			{Queue: "emails", Type: "email.receipt", Key: "r2", Payload: map[string]any{"order": 2}},
			{Queue: "emails", Type: "email.unconfigured", Key: "u1"},
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(wctx, []string{"--database-url", dsn, "work", "--metrics-addr", ""}, &out, &out)
	}()
	state := func(id int64) (s string) {
		if err := pool.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	waitUntil(t, ctx, func() bool { return state(ids[0]) == "completed" && state(ids[1]) == "completed" })
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("work exited %d:\n%s", code, out.String())
	}
	if verified.Load() != 2 || refused.Load() != 0 {
		t.Errorf("endpoint: %d verified, %d refused; want 2 and 0", verified.Load(), refused.Load())
	}
	if s := state(ids[2]); s != "available" {
		t.Errorf("an unconfigured type of the queue: %s, want available (never delivered)", s)
	}
	if strings.Contains(out.String(), hookSecret[6:]) {
		t.Errorf("work's output carries the secret")
	}
}

// TestWorkRefusesABadHTTPDeliveryFile: a configuration that cannot be used
// stops work with the reason, rather than leaving effects unserved.
func TestWorkRefusesABadHTTPDeliveryFile(t *testing.T) {
	_, dsn := pgtest.NewPool(t)
	conf := filepath.Join(t.TempDir(), "http-delivery.json")
	if err := os.WriteFile(conf, []byte(`{"endpoints": {"m": {"url": "http://127.0.0.1:1/", "secret_env": "UNSET_HOOK_SECRET"}},
		"types": [{"queue": "emails", "type": "email.receipt", "endpoint": "m"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGOUTBOX_HTTP_DELIVERY", conf)
	code, _, errs := run(t, "--database-url", dsn, "work", "--metrics-addr", "")
	if code != cli.ExitCouldNotRun || !strings.Contains(errs, "UNSET_HOOK_SECRET is not set") {
		t.Fatalf("work with an unusable PGOUTBOX_HTTP_DELIVERY: exit %d, %q", code, errs)
	}
}
