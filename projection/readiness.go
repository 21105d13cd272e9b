package projection

import (
	"fmt"
	"strings"
	"time"
)

// Readiness thresholds (docs/projection.md).
const (
	// SolrRecordThreshold: Solr is needed at 50,000 records.
	SolrRecordThreshold = 50_000
	// SolrSearchP95Threshold: or when the in-app search p95 reaches 1000 ms.
	SolrSearchP95Threshold = 1000
	// SolrDiscoveryWorkflowsThreshold: or with 3 active discovery workflows
	// over WorkflowRecordThreshold records.
	SolrDiscoveryWorkflowsThreshold = 3
	// GraphP95Threshold: GraphDB is needed when the graph p95 reaches 1500 ms.
	GraphP95Threshold = 1500
	// GraphWorkflowsThreshold: or with 2 active graph workflows over
	// WorkflowRecordThreshold records.
	GraphWorkflowsThreshold = 2
	// WorkflowRecordThreshold is the record count the workflow triggers need.
	WorkflowRecordThreshold = 10_000
	// WatchFraction: "watch" from 80 % of a threshold.
	WatchFraction = 0.8
)

// Classifications, from least to most urgent.
const (
	// ClassPortable: PostgreSQL alone serves discovery and graph reads.
	ClassPortable = "portable"
	// ClassWatch: a threshold is within 80 %: prepare credentials.
	ClassWatch = "watch"
	// ClassEnable: a threshold is met and its target or the scheduler is not
	// ready: turn it on (`--check` exits 3).
	ClassEnable = "enable"
	// ClassEnabled: every needed target is on and the cron drain is ready (or
	// a target is on although none is needed yet).
	ClassEnabled = "enabled"
)

// ReadinessInputs are the measurements a classification is made from.
type ReadinessInputs struct {
	Records                  int64 `json:"records"`
	RecordsFromDatabase      bool  `json:"records_from_database"`
	ActiveDiscoveryWorkflows int   `json:"active_discovery_workflows"`
	ActiveGraphWorkflows     int   `json:"active_graph_workflows"`
	SearchP95MS              int   `json:"search_p95_ms"`
	GraphP95MS               int   `json:"graph_p95_ms"`
	// SolrEnabled and GraphDBEnabled: the target is on and configured.
	SolrEnabled    bool `json:"solr_enabled"`
	GraphDBEnabled bool `json:"graphdb_enabled"`
	// CronSecretSet and CronEnabled: the scheduler prerequisites.
	CronSecretSet bool `json:"cron_secret_set"`
	CronEnabled   bool `json:"cron_enabled"`
}

// TargetReadiness is one target's verdict.
type TargetReadiness struct {
	// Level is ClassPortable, ClassWatch or ClassEnable (the threshold level
	// reached, whatever the target's state).
	Level string `json:"level"`
	// Enabled reports the target's state.
	Enabled bool `json:"enabled"`
	// Triggers are the conditions that reached Level.
	Triggers []string `json:"triggers"`
}

// Readiness is the result of `pgoutbox readiness projection`, written to
// artifacts/launch/projection-readiness-latest.json.
type Readiness struct {
	GeneratedAt    time.Time `json:"generated_at"`
	Classification string    `json:"classification"`
	// RecommendedTarget is "solr", "graphdb", "solr+graphdb" or "none".
	RecommendedTarget string                     `json:"recommended_target"`
	Inputs            ReadinessInputs            `json:"inputs"`
	Targets           map[string]TargetReadiness `json:"targets"`
	Reasons           []string                   `json:"reasons"`
	// Prerequisites are what must be set before the recommended target can
	// be turned on (empty when ready).
	Prerequisites []string `json:"prerequisites"`
	// CheckFailed is true when the scale path should be enabled but the
	// target or the scheduler is not ready (`--check` exits 3).
	CheckFailed bool `json:"check_failed"`
}

// atLeast reports whether v reaches threshold t scaled by f.
func atLeast(v float64, t float64, f float64) bool { return v >= t*f }

// level of a target from its triggers at 100 % and at WatchFraction.
func levelOf(check func(f float64) []string) TargetReadiness {
	if tr := check(1); len(tr) > 0 {
		return TargetReadiness{Level: ClassEnable, Triggers: tr}
	}
	if tr := check(WatchFraction); len(tr) > 0 {
		return TargetReadiness{Level: ClassWatch, Triggers: tr}
	}
	return TargetReadiness{Level: ClassPortable, Triggers: []string{}}
}

// Classify applies the thresholds to in.
func Classify(in ReadinessInputs, now time.Time) Readiness {
	recs := float64(in.Records)
	solrT := levelOf(func(f float64) []string {
		var t []string
		if atLeast(recs, SolrRecordThreshold, f) {
			t = append(t, fmt.Sprintf("%d records ≥ %.0f", in.Records, SolrRecordThreshold*f))
		}
		if atLeast(float64(in.SearchP95MS), SolrSearchP95Threshold, f) {
			t = append(t, fmt.Sprintf("search p95 %d ms ≥ %.0f ms", in.SearchP95MS, SolrSearchP95Threshold*f))
		}
		if atLeast(float64(in.ActiveDiscoveryWorkflows), SolrDiscoveryWorkflowsThreshold, f) && atLeast(recs, WorkflowRecordThreshold, f) {
			t = append(t, fmt.Sprintf("%d active discovery workflows ≥ %g over %d records ≥ %.0f",
				in.ActiveDiscoveryWorkflows, SolrDiscoveryWorkflowsThreshold*f, in.Records, WorkflowRecordThreshold*f))
		}
		return t
	})
	graphT := levelOf(func(f float64) []string {
		var t []string
		if atLeast(float64(in.GraphP95MS), GraphP95Threshold, f) {
			t = append(t, fmt.Sprintf("graph p95 %d ms ≥ %.0f ms", in.GraphP95MS, GraphP95Threshold*f))
		}
		if atLeast(float64(in.ActiveGraphWorkflows), GraphWorkflowsThreshold, f) && atLeast(recs, WorkflowRecordThreshold, f) {
			t = append(t, fmt.Sprintf("%d active graph workflows ≥ %g over %d records ≥ %.0f",
				in.ActiveGraphWorkflows, GraphWorkflowsThreshold*f, in.Records, WorkflowRecordThreshold*f))
		}
		return t
	})
	solrT.Enabled, graphT.Enabled = in.SolrEnabled, in.GraphDBEnabled
	r := Readiness{
		GeneratedAt: now.UTC(), Inputs: in,
		Targets:       map[string]TargetReadiness{TargetSolr: solrT, TargetGraphDB: graphT},
		Reasons:       []string{},
		Prerequisites: []string{},
	}
	cronReady := in.CronSecretSet && in.CronEnabled
	var needed, missing []string
	for _, x := range []struct {
		name string
		tr   TargetReadiness
		flag string
		env  string
	}{
		{TargetSolr, solrT, "OUTBOX_PROJECT_TO_SOLR=1", "SOLR_BASE_URL, SOLR_CORE, SOLR_USERNAME, SOLR_PASSWORD"},
		{TargetGraphDB, graphT, "OUTBOX_PROJECT_TO_GRAPHDB=1", "GRAPHDB_BASE_URL, GRAPHDB_REPOSITORY_ID, GRAPHDB_USERNAME, GRAPHDB_PASSWORD"},
	} {
		switch x.tr.Level {
		case ClassEnable:
			needed = append(needed, x.name)
			r.Reasons = append(r.Reasons, x.name+" needed: "+strings.Join(x.tr.Triggers, "; "))
			if !x.tr.Enabled {
				missing = append(missing, x.name)
				r.Prerequisites = append(r.Prerequisites, "set "+x.env, "set "+x.flag)
			}
		case ClassWatch:
			r.Reasons = append(r.Reasons, x.name+" within 80 % of a threshold: "+strings.Join(x.tr.Triggers, "; "))
		}
	}
	if len(needed) > 0 && !cronReady {
		if !in.CronSecretSet {
			r.Prerequisites = append(r.Prerequisites, "set CRON_SECRET")
		}
		if !in.CronEnabled {
			r.Prerequisites = append(r.Prerequisites, "set METAMUSEUM_OUTBOX_CRON_ENABLED=1")
		}
		r.Reasons = append(r.Reasons, "the cron drain is not ready (CRON_SECRET and METAMUSEUM_OUTBOX_CRON_ENABLED=1 are required)")
	}
	switch {
	case len(needed) > 0 && (len(missing) > 0 || !cronReady):
		r.Classification = ClassEnable
		r.CheckFailed = true
		if len(missing) > 0 {
			r.RecommendedTarget = strings.Join(missing, "+")
		} else {
			r.RecommendedTarget = strings.Join(needed, "+")
		}
	case len(needed) > 0:
		r.Classification = ClassEnabled
		r.RecommendedTarget = strings.Join(needed, "+")
		r.Reasons = append(r.Reasons, "every needed target is on and the cron drain is ready")
	case in.SolrEnabled || in.GraphDBEnabled:
		r.Classification = ClassEnabled
		r.RecommendedTarget = "none"
		r.Reasons = append(r.Reasons, "a target is on although no threshold is met")
	case solrT.Level == ClassWatch || graphT.Level == ClassWatch:
		r.Classification = ClassWatch
		r.RecommendedTarget = "none"
		r.Reasons = append(r.Reasons, "prepare the credentials and the cron secret; re-run readiness regularly")
	default:
		r.Classification = ClassPortable
		r.RecommendedTarget = "none"
		r.Reasons = append(r.Reasons, "PostgreSQL alone serves search and graph reads; no threshold is near")
	}
	return r
}
