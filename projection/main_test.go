package projection_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/sparql/sparqltest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/projection"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, sparqltest.Stop, func() error { return goleak.Find() })
}

const token = "test-api-token"

// bundle is what a test gets from setup.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	app  *projection.App
	srv  *httptest.Server
	cfg  projection.Config
}

// setup starts the projection's routes on a test server over a migrated
// database of the test's own. cfg's zero fields take defaults; APIToken
// defaults to token unless noToken.
func setup(t *testing.T, cfg projection.Config) *bundle {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	return setupOn(t, pool, cfg)
}

// setupOn is setup on a given pool.
func setupOn(t *testing.T, pool *pgxpool.Pool, cfg projection.Config) *bundle {
	t.Helper()
	ctx := pgtest.Context(t, 8*time.Minute)
	if cfg.APIToken == "" {
		cfg.APIToken = token
	}
	if cfg.APIToken == "-" {
		cfg.APIToken = ""
	}
	app, err := projection.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	app.Routes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &bundle{ctx: ctx, pool: pool, app: app, srv: srv, cfg: cfg}
}

// do sends a request with the API token and returns status, body.
func (b *bundle) do(t *testing.T, method, path, contentType string, body io.Reader, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(b.ctx, method, b.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out, resp.Header
}

func (b *bundle) postJSON(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	code, out, _ := b.do(t, http.MethodPost, path, "application/json", strings.NewReader(body))
	return code, out
}

// staleThenCurrent leases a record's two waiting effects the only way
// per-key ordering allows: the first is leased and its completion
// committed without a delivery (as when its worker's lease was lost and it
// still delivers late), then the second. The caller delivers them in any
// order: the version checks must keep the newer state either way.
func (b *bundle) staleThenCurrent(t *testing.T) (older, newer *pgoutbox.Lease) {
	t.Helper()
	var got []*pgoutbox.Lease
	for range 2 {
		leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, projection.Queue, "t", 10, time.Minute)
		if err != nil || len(leases) != 1 {
			t.Fatalf("claim: %v %d (one at a time: the effects share an ordering key)", err, len(leases))
		}
		if err := leases[0].Complete(b.ctx, b.pool); err != nil {
			t.Fatal(err)
		}
		got = append(got, leases[0])
	}
	return got[0], got[1]
}

// completeAll leases and completes, without delivering, every waiting
// effect of the queue, one ordering key's head at a time.
func (b *bundle) completeAll(t *testing.T) (n int) {
	t.Helper()
	for {
		leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, projection.Queue, "t", 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(leases) == 0 {
			return n
		}
		for _, l := range leases {
			if err := l.Complete(b.ctx, b.pool); err != nil {
				t.Fatal(err)
			}
		}
		n += len(leases)
	}
}

func (b *bundle) scalar(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	return pgtest.Scalar(t, b.ctx, b.pool, sql, args...)
}

// counts is (records, effects), to prove a request wrote nothing.
func (b *bundle) counts(t *testing.T) [2]int64 {
	t.Helper()
	return [2]int64{
		b.scalar(t, `SELECT count(*) FROM storage_documents.records`),
		b.scalar(t, `SELECT count(*) FROM pgoutbox.effects`),
	}
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// startClient runs the projection's queue in an engine client (as serve
// does) and stops it at cleanup.
func (b *bundle) startClient(t *testing.T) *pgoutbox.Client {
	t.Helper()
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		Queues:       b.app.Queues(),
		Types:        b.app.EffectTypes(),
		BackoffCap:   time.Millisecond,
		PollInterval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return c
}
