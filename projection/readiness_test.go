package projection_test

import (
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/projection"
)

func TestReadinessThresholds(t *testing.T) {
	t.Parallel()
	ready := func(in projection.ReadinessInputs) projection.ReadinessInputs {
		in.CronSecretSet, in.CronEnabled = true, true
		return in
	}
	type in = projection.ReadinessInputs
	for _, tc := range []struct {
		name   string
		in     in
		class  string
		target string
		check  bool
	}{
		{"empty", in{}, "portable", "none", false},
		// Solr: 50,000 records; watch from 40,000.
		{"records 39,999", in{Records: 39_999}, "portable", "none", false},
		{"records 40,000", in{Records: 40_000}, "watch", "none", false},
		{"records 49,999", in{Records: 49_999}, "watch", "none", false},
		{"records 50,000", in{Records: 50_000}, "enable", "solr", true},
		{"records 50,000 solr on, cron off", in{Records: 50_000, SolrEnabled: true}, "enable", "solr", true},
		{"records 50,000 solr on, secret only", in{Records: 50_000, SolrEnabled: true, CronSecretSet: true}, "enable", "solr", true},
		{"records 50,000 all ready", ready(in{Records: 50_000, SolrEnabled: true}), "enabled", "solr", false},
		{"records 50,000 graphdb on only", ready(in{Records: 50_000, GraphDBEnabled: true}), "enable", "solr", true},
		// Solr: search p95 1000 ms; watch from 800.
		{"search 799", in{SearchP95MS: 799}, "portable", "none", false},
		{"search 800", in{SearchP95MS: 800}, "watch", "none", false},
		{"search 999", in{SearchP95MS: 999}, "watch", "none", false},
		{"search 1000", in{SearchP95MS: 1000}, "enable", "solr", true},
		// Solr: 3 discovery workflows over 10,000 records; watch from 80 % of both.
		{"discovery 3 over 9,999", in{ActiveDiscoveryWorkflows: 3, Records: 9_999}, "watch", "none", false},
		{"discovery 3 over 7,999", in{ActiveDiscoveryWorkflows: 3, Records: 7_999}, "portable", "none", false},
		{"discovery 2 over 10,000", in{ActiveDiscoveryWorkflows: 2, Records: 10_000}, "portable", "none", false},
		{"discovery 3 over 10,000", in{ActiveDiscoveryWorkflows: 3, Records: 10_000}, "enable", "solr", true},
		// GraphDB: graph p95 1500 ms; watch from 1200.
		{"graph 1199", in{GraphP95MS: 1199}, "portable", "none", false},
		{"graph 1200", in{GraphP95MS: 1200}, "watch", "none", false},
		{"graph 1499", in{GraphP95MS: 1499}, "watch", "none", false},
		{"graph 1500", in{GraphP95MS: 1500}, "enable", "graphdb", true},
		{"graph 1500 ready", ready(in{GraphP95MS: 1500, GraphDBEnabled: true}), "enabled", "graphdb", false},
		// GraphDB: 2 graph workflows over 10,000 records.
		{"graph workflows 1 over 10,000", in{ActiveGraphWorkflows: 1, Records: 10_000}, "portable", "none", false},
		{"graph workflows 2 over 8,000", in{ActiveGraphWorkflows: 2, Records: 8_000}, "watch", "none", false},
		{"graph workflows 2 over 9,999", in{ActiveGraphWorkflows: 2, Records: 9_999}, "watch", "none", false},
		{"graph workflows 2 over 10,000", in{ActiveGraphWorkflows: 2, Records: 10_000}, "enable", "graphdb", true},
		// Both.
		{"both needed", in{Records: 60_000, GraphP95MS: 2000}, "enable", "solr+graphdb", true},
		{"both needed, solr ready", ready(in{Records: 60_000, GraphP95MS: 2000, SolrEnabled: true}), "enable", "graphdb", true},
		{"both ready", ready(in{Records: 60_000, GraphP95MS: 2000, SolrEnabled: true, GraphDBEnabled: true}), "enabled", "solr+graphdb", false},
		// A target on without any need.
		{"on without need", in{SolrEnabled: true}, "enabled", "none", false},
	} {
		r := projection.Classify(tc.in, time.Unix(0, 0))
		if r.Classification != tc.class || r.RecommendedTarget != tc.target || r.CheckFailed != tc.check {
			t.Errorf("%s: %s/%s check=%v, want %s/%s check=%v (reasons %v)", tc.name,
				r.Classification, r.RecommendedTarget, r.CheckFailed, tc.class, tc.target, tc.check, r.Reasons)
		}
		if r.Classification == "enable" && len(r.Prerequisites) == 0 {
			t.Errorf("%s: enable without prerequisites", tc.name)
		}
	}
	r := projection.Classify(in{Records: 50_000}, time.Unix(0, 0))
	want := map[string]bool{"set CRON_SECRET": true, "set METAMUSEUM_OUTBOX_CRON_ENABLED=1": true, "set OUTBOX_PROJECT_TO_SOLR=1": true}
	for _, p := range r.Prerequisites {
		delete(want, p)
	}
	if len(want) != 0 {
		t.Errorf("prerequisites %v lack %v", r.Prerequisites, want)
	}
}
