package projection

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/adapters/solr"
	"github.com/pgoutbox/pgoutbox/adapters/sparql"
)

// TestFromEnvNamesVariables: a target switched on with a missing or bad
// setting is reported by the environment variable the operator sets, while
// the library itself names the Go field.
func TestFromEnvNamesVariables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env     map[string]string
		target  string
		library string // what the library's Validate says
		want    string // what FromEnv says
	}{
		{map[string]string{"OUTBOX_PROJECT_TO_SOLR": "1", "SOLR_BASE_URL": "http://solr:8983/solr"}, TargetSolr,
			"solr: Config.Core is empty", "SOLR_CORE is empty"},
		{map[string]string{"OUTBOX_PROJECT_TO_SOLR": "1", "SOLR_CORE": "c"}, TargetSolr,
			"solr: Config.BaseURL is empty", "SOLR_BASE_URL is empty"},
		{map[string]string{"OUTBOX_PROJECT_TO_SOLR": "1", "SOLR_BASE_URL": "http://solr/solr", "SOLR_CORE": "c", "SOLR_PASSWORD": "pw"}, TargetSolr,
			"solr: Config.Password is set but Config.Username is empty", "SOLR_PASSWORD is set but SOLR_USERNAME is empty"},
		{map[string]string{"OUTBOX_PROJECT_TO_GRAPHDB": "1", "GRAPHDB_BASE_URL": "http://g:7200"}, TargetGraphDB,
			"sparql: Config.RepositoryID is empty (or set Config.UpdateURL)", "GRAPHDB_REPOSITORY_ID is empty (or set GRAPHDB_UPDATE_URL)"},
		{map[string]string{"OUTBOX_PROJECT_TO_GRAPHDB": "1", "GRAPHDB_UPDATE_URL": "ftp://g/sparql"}, TargetGraphDB,
			"sparql: the update URL (Config.UpdateURL or Config.BaseURL) is not an http(s) URL",
			"the update URL (GRAPHDB_UPDATE_URL or GRAPHDB_BASE_URL) is not an http(s) URL"},
		{map[string]string{"OUTBOX_PROJECT_TO_GRAPHDB": "1", "GRAPHDB_UPDATE_URL": "http://g/sparql", "GRAPHDB_GRAPH_PREFIX": "urn:a b"}, TargetGraphDB,
			`sparql: Config.GraphPrefix "urn:a b" holds " ", which an IRI may not`, `GRAPHDB_GRAPH_PREFIX "urn:a b" holds " ", which an IRI may not`},
	} {
		getenv := func(k string) string { return tc.env[k] }
		cfg, err := FromEnv(getenv)
		if err == nil || !strings.Contains(err.Error(), "=1 but "+tc.want) || cfg.Disabled[tc.target] != tc.want {
			t.Errorf("%v: FromEnv %v, Disabled %q; want %q", tc.env, err, cfg.Disabled[tc.target], tc.want)
		}
		if strings.Contains(err.Error(), "Config.") {
			t.Errorf("%v: FromEnv names a Go field: %v", tc.env, err)
		}
		if cfg.Solr != nil || cfg.SPARQL != nil {
			t.Errorf("%v: a target with a bad setting is on", tc.env)
		}
		// The same settings given to the library directly: the Go field.
		var lib error
		if tc.target == TargetSolr {
			_, lib = solr.New(solr.Config{BaseURL: getenv("SOLR_BASE_URL"), Core: getenv("SOLR_CORE"), Password: getenv("SOLR_PASSWORD")})
		} else {
			_, lib = sparql.New(sparql.Config{BaseURL: getenv("GRAPHDB_BASE_URL"), UpdateURL: getenv("GRAPHDB_UPDATE_URL"), GraphPrefix: getenv("GRAPHDB_GRAPH_PREFIX")})
		}
		if lib == nil || lib.Error() != tc.library {
			t.Errorf("%v: library %v, want %q", tc.env, lib, tc.library)
		}
	}
}

// TestEnvTablesMatchFromEnv pins solrEnv and sparqlEnv to what FromEnv
// reads: each variable named for a field lands in that field, so an error
// about the field is reported by the variable that sets it.
func TestEnvTablesMatchFromEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_PROJECT_TO_SOLR": "1", "OUTBOX_PROJECT_TO_GRAPHDB": "1"}
	for field, name := range solrEnv {
		env[name] = "http://solr-" + strings.ToLower(field) + "/solr"
	}
	for field, name := range sparqlEnv {
		env[name] = "http://graph-" + strings.ToLower(field) + "/x"
	}
	env["SOLR_COMMIT_WITHIN_MS"] = "1500"
	env["GRAPHDB_GRAPH_PREFIX"] = "urn:graph-prefix:"
	cfg, err := FromEnv(func(k string) string { return env[k] })
	if err != nil || cfg.Solr == nil || cfg.SPARQL == nil {
		t.Fatalf("FromEnv: %v", err)
	}
	check := func(c any, table map[string]string) {
		v := reflect.ValueOf(c)
		for field, name := range table {
			f := v.FieldByName(field)
			if !f.IsValid() {
				t.Errorf("%s maps the unknown field %T.%s", name, c, field)
				continue
			}
			got := fmt.Sprint(f.Interface())
			if d, ok := f.Interface().(time.Duration); ok {
				got = fmt.Sprint(d.Milliseconds())
			}
			if got != env[name] {
				t.Errorf("%s=%q set %T.%s to %q", name, env[name], c, field, got)
			}
		}
	}
	check(*cfg.Solr, solrEnv)
	check(*cfg.SPARQL, sparqlEnv)
}
