package ops_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v2"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func repoPath(elem ...string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(append([]string{filepath.Dir(file), "..", ".."}, elem...)...)
}

// recorder is a Registerer that keeps what is registered, to list every
// metric name pgoutbox can export (vectors without children included).
type recorder struct{ names []string }

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String()); m != nil {
			r.names = append(r.names, m[1])
		}
	}
	return nil
}
func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}
func (r *recorder) Unregister(prometheus.Collector) bool { return true }

// exportedNames are the metric names of the engine's Client and of the ops
// collector.
func exportedNames(t *testing.T) []string {
	t.Helper()
	rec := &recorder{}
	if _, err := pgoutbox.NewClient(setup(t).pool, pgoutbox.Config{Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	rec.MustRegister(ops.NewCollector(nil, nil))
	return rec.names
}

type rulesFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRulesFile validates deploy/prometheus/alerts.yml: with promtool
// (check rules, and the unit tests in alerts_test.yml) when it is installed,
// and always in Go: structure, durations, severities, runbook anchors that
// exist in docs/operations.md, and metric names that pgoutbox exports.
func TestAlertRulesFile(t *testing.T) {
	t.Parallel()
	path := repoPath("deploy", "prometheus", "alerts.yml")
	if promtool, err := exec.LookPath("promtool"); err == nil {
		for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
			cmd := exec.Command(promtool, args...)
			cmd.Dir = filepath.Dir(path)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool %v: %v\n%s", args, err, out)
			}
		}
	} else {
		t.Log("promtool not installed (apt-get install prometheus): validating in Go only")
	}

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f rulesFile
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	runbooks, err := os.ReadFile(repoPath("docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, h := range regexp.MustCompile(`(?m)^#{1,6} (.+)$`).FindAllStringSubmatch(string(runbooks), -1) {
		slug := strings.ToLower(regexp.MustCompile(`[^\w\- ]`).ReplaceAllString(h[1], ""))
		anchors[strings.ReplaceAll(slug, " ", "-")] = true
	}
	exported := exportedNames(t)
	var alerts []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if !regexp.MustCompile(`^Pgoutbox[A-Z][A-Za-z]+$`).MatchString(r.Alert) || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("rule %q: bad name or empty expression", r.Alert)
			}
			if _, err := model.ParseDuration(r.For); err != nil {
				t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
			}
			if s := r.Labels["severity"]; s != "page" && s != "ticket" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: summary and description are required", r.Alert)
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook"], "docs/operations.md#")
			if !ok || !anchors[anchor] {
				t.Errorf("%s: runbook %q is not a heading of docs/operations.md", r.Alert, r.Annotations["runbook"])
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") || strings.Count(r.Expr, "{") != strings.Count(r.Expr, "}") {
				t.Errorf("%s: unbalanced expression", r.Alert)
			}
			for _, name := range regexp.MustCompile(`pgoutbox_[a-z_]+`).FindAllString(r.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
				if !slices.Contains(exported, base) {
					t.Errorf("%s: uses %s, which pgoutbox does not export (%v)", r.Alert, name, exported)
				}
			}
		}
	}
	// The rules docs/operations.md lists.
	for _, want := range []string{"PgoutboxReconciliationRequired", "PgoutboxDeadLettersGrowing",
		"PgoutboxOldestAvailableTooOld", "PgoutboxClaimLatencyHigh"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alerts.yml lacks %s", want)
		}
	}
}
