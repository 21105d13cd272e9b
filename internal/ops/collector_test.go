package ops_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// countingDB is the real pool, counting the statements sent through it.
type countingDB struct {
	store.DBTX
	statements atomic.Int64
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.statements.Add(1)
	return c.DBTX.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.statements.Add(1)
	return c.DBTX.QueryRow(ctx, sql, args...)
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.statements.Add(1)
	return c.DBTX.Exec(ctx, sql, args...)
}

// sensitive are values seeded into payloads, keys and errors that must never
// reach a label.
var sensitive = []string{"installation-4242", "repo-octo/secret-repo", "delivery-9f8e7d", "payload-marker-xyz"}

func seedSensitive(t *testing.T, b *bundle) {
	t.Helper()
	payload := `{"installation_id": "installation-4242", "repository": "repo-octo/secret-repo", "delivery": "delivery-9f8e7d", "note": "payload-marker-xyz"}`
	seed(t, b.ctx, b.pool,
		eff{queue: "control_plane_outbox", typ: "github.check_run.create", state: "available", availableAgo: 40, payload: payload, key: "delivery-9f8e7d"},
		eff{queue: "control_plane_outbox", typ: "github.check_run.create", state: "available", attempts: 2, availableAgo: 5, payload: payload},
		eff{queue: "control_plane_outbox", typ: "github.workflow.dispatch", state: "reconciliation_required", attempts: 1, leasedAgo: 30, started: true, payload: payload, lastError: "repo-octo/secret-repo timeout"},
		eff{queue: "outbox_events", typ: "record.upsert", state: "dead_letter", attempts: 8, completedAgo: 3, payload: payload, lastError: "installation-4242"},
		eff{queue: "outbox_events", typ: "record.upsert", state: "leased", attempts: 1, leasedAgo: 3600, payload: payload},
	)
}

// scrape fetches /metrics from h and parses it with the Prometheus text
// parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

// checkLabels fails when a pgoutbox_ series carries a label other than
// queue, effect_type, state and outcome (and le for histograms), or a value
// seeded into a payload, key or error.
func checkLabels(t *testing.T, families map[string]*dto.MetricFamily) {
	t.Helper()
	allowed := []string{"queue", "effect_type", "state", "outcome", "le"}
	for name, f := range families {
		if !strings.HasPrefix(name, "pgoutbox_") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(allowed, l.GetName()) {
					t.Errorf("%s has label %q", name, l.GetName())
				}
				for _, s := range sensitive {
					if strings.Contains(l.GetValue(), s) {
						t.Errorf("%s label %s carries %q", name, l.GetName(), l.GetValue())
					}
				}
			}
		}
	}
}

func gauge(families map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for k, v := range labels {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

func TestCollectorExposition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedSensitive(t, b)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.queue_pauses (queue, paused_by) VALUES ('outbox_events', 'ops')`); err != nil {
		t.Fatal(err)
	}
	db := &countingDB{DBTX: b.pool}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ops.NewCollector(ops.NewStatsCache(db, ops.StatusOptions{}, 0), nil))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	families := scrape(t, srv.URL)
	types := map[string]dto.MetricType{
		"pgoutbox_effects":                           dto.MetricType_GAUGE,
		"pgoutbox_effects_retrying":                  dto.MetricType_GAUGE,
		"pgoutbox_effects_parked":                    dto.MetricType_GAUGE,
		"pgoutbox_oldest_available_age_seconds":      dto.MetricType_GAUGE,
		"pgoutbox_stalled_leases":                    dto.MetricType_GAUGE,
		"pgoutbox_oldest_xmin_age_seconds":           dto.MetricType_GAUGE,
		"pgoutbox_stats_refreshed_timestamp_seconds": dto.MetricType_GAUGE,
		"pgoutbox_stats_refresh_errors_total":        dto.MetricType_COUNTER,
		"pgoutbox_queue_paused":                      dto.MetricType_GAUGE,
	}
	for name, typ := range types {
		if f := families[name]; f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want type %v", name, f, typ)
		}
	}
	checkLabels(t, families)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"pgoutbox_effects", map[string]string{"queue": "control_plane_outbox", "effect_type": "github.check_run.create", "state": "available"}, 2},
		{"pgoutbox_effects", map[string]string{"queue": "control_plane_outbox", "effect_type": "github.check_run.create", "state": "dead_letter"}, 0},
		{"pgoutbox_effects", map[string]string{"queue": "control_plane_outbox", "effect_type": "github.workflow.dispatch", "state": "reconciliation_required"}, 1},
		{"pgoutbox_effects", map[string]string{"queue": "outbox_events", "state": "dead_letter"}, 1},
		{"pgoutbox_effects_retrying", map[string]string{"queue": "control_plane_outbox", "effect_type": "github.check_run.create"}, 1},
		{"pgoutbox_stalled_leases", map[string]string{"queue": "outbox_events"}, 1},
		{"pgoutbox_queue_paused", map[string]string{"queue": "outbox_events"}, 1},
		{"pgoutbox_queue_paused", map[string]string{"queue": "control_plane_outbox"}, 0},
	} {
		if v, ok := gauge(families, c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s%v = %v (%v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if v, ok := gauge(families, "pgoutbox_oldest_available_age_seconds",
		map[string]string{"queue": "control_plane_outbox", "effect_type": "github.check_run.create"}); !ok || v < 40 || v > 100 {
		t.Errorf("oldest available age %v", v)
	}

	// Further scrapes within the cache's max age reuse the snapshot: the
	// database saw one aggregate query (and one horizon read, one read of
	// the pauses) in all.
	first := db.statements.Load()
	scrape(t, srv.URL)
	scrape(t, srv.URL)
	if first != 3 || db.statements.Load() != first {
		t.Fatalf("statements: %d after the first scrape, %d after three", first, db.statements.Load())
	}
}

func TestCollectorReportsRefreshErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `DROP TABLE pgoutbox.effects CASCADE`); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ops.NewCollector(ops.NewStatsCache(b.pool, ops.StatusOptions{}, 0), nil))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	families := scrape(t, srv.URL)
	if f := families["pgoutbox_stats_refresh_errors_total"]; f == nil || f.GetMetric()[0].GetCounter().GetValue() != 1 {
		t.Fatalf("errors counter: %v", f)
	}
	if families["pgoutbox_effects"] != nil {
		t.Fatal("gauges exported without statistics")
	}
}
