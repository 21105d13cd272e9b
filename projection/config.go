package projection

import (
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/solr"
	"github.com/pgoutbox/pgoutbox/adapters/sparql"
)

// Defaults of Config. Each applies when the field is zero.
const (
	// ImportBatchDefault is the most rows one import transaction writes
	// (PROJECTION_IMPORT_BATCH).
	ImportBatchDefault = 500
	// MaxRecordBytesDefault is the largest record accepted, in bytes of JSON
	// (or of CSV fields) (PROJECTION_MAX_RECORD_BYTES); also the body limit of
	// POST /api/records.
	MaxRecordBytesDefault = 256 << 10
	// MaxImportBytesDefault is the largest import body (PROJECTION_IMPORT_MAX_BYTES):
	// 4 GiB. The import streams, so memory does not grow with it.
	MaxImportBytesDefault = 4 << 30
	// CronLimitDefault is the most effects one cron cycle delivers
	// (METAMUSEUM_OUTBOX_CRON_LIMIT).
	CronLimitDefault = 100
	// CronScheduleDefault is how often the platform scheduler calls
	// GET /api/cron/outbox (every 5 minutes).
	CronScheduleDefault = 5 * time.Minute
	// BatchDefault is the most effects one projector batch claims
	// (`projector once`, and each batch of `projector drain`).
	BatchDefault = 100
	// ConcurrencyDefault is how many deliveries a projector batch runs at once.
	ConcurrencyDefault = 8
	// LeaseDefault is the lease of a projector batch's claims; each delivery's
	// HTTP timeout (the targets' Timeout) stays below it.
	LeaseDefault = 60 * time.Second
	// SearchLimitDefault is the number of records GET /api/records returns
	// unless ?limit= says otherwise (at most SearchLimitMax).
	SearchLimitDefault = 50
	// SearchLimitMax caps ?limit=.
	SearchLimitMax = 1000
)

// Config configures the projection application. Zero fields take the
// documented defaults; FromEnv reads every field from the environment.
type Config struct {
	// APIToken is the bearer token of /api/records and /api/import
	// (PGOUTBOX_API_TOKEN). Empty: those routes answer 503 "not configured".
	APIToken string
	// Solr enables the Solr target (OUTBOX_PROJECT_TO_SOLR=1); nil: off.
	Solr *solr.Config
	// SPARQL enables the SPARQL graph store target
	// (OUTBOX_PROJECT_TO_GRAPHDB=1); nil: off.
	SPARQL *sparql.Config
	// Disabled says, per target name ("solr", "graphdb"), why a target is
	// off ("OUTBOX_PROJECT_TO_SOLR is not 1", "SOLR_BASE_URL is empty").
	// FromEnv fills it; /workers and readiness show it.
	Disabled map[string]string
	// CronSecret is the bearer of GET /api/cron/outbox (CRON_SECRET). Empty:
	// every call answers 401.
	CronSecret string
	// CronEnabled lets the cron endpoint run a cycle
	// (METAMUSEUM_OUTBOX_CRON_ENABLED=1). Default false: the endpoint answers
	// "disabled" and claims nothing.
	CronEnabled bool
	// CronLimit is the most effects one cron cycle delivers
	// (METAMUSEUM_OUTBOX_CRON_LIMIT); default CronLimitDefault (100).
	CronLimit int
	// CronSchedule is the scheduler's period, for /workers' next wake-up;
	// default CronScheduleDefault (5 min).
	CronSchedule time.Duration
	// MaxAttempts of each record.upsert effect (OUTBOX_MAX_ATTEMPTS); default
	// pgoutbox.MaxAttemptsDefault (8).
	MaxAttempts int
	// ImportBatch is the most rows per import transaction
	// (PROJECTION_IMPORT_BATCH); default ImportBatchDefault (500).
	ImportBatch int
	// MaxRecordBytes is the largest record (PROJECTION_MAX_RECORD_BYTES);
	// default MaxRecordBytesDefault (256 KiB).
	MaxRecordBytes int
	// MaxImportBytes is the largest import body (PROJECTION_IMPORT_MAX_BYTES);
	// default MaxImportBytesDefault (4 GiB).
	MaxImportBytes int64
	// Lease is the lease of the projector's and the cron's claims
	// (OUTBOX_LEASE_DURATION); default LeaseDefault (60 s).
	Lease time.Duration
	// BackoffCap caps retry backoff (OUTBOX_BACKOFF_CAP); default
	// pgoutbox.BackoffCapDefault (300 s).
	BackoffCap time.Duration
	// Concurrency is how many deliveries run at once in a projector batch,
	// and the worker pool size of the queue when served
	// (OUTBOX_PROJECTION_CONCURRENCY); default ConcurrencyDefault (8).
	Concurrency int
	// Logger receives logs; default discards them.
	Logger *slog.Logger
}

// TargetSolr and TargetGraphDB name the targets in Disabled, readiness and
// /workers.
const (
	TargetSolr    = "solr"
	TargetGraphDB = "graphdb"
)

func (c Config) withDefaults() Config {
	if c.CronLimit <= 0 {
		c.CronLimit = CronLimitDefault
	}
	if c.CronSchedule <= 0 {
		c.CronSchedule = CronScheduleDefault
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = pgoutbox.MaxAttemptsDefault
	}
	if c.ImportBatch <= 0 {
		c.ImportBatch = ImportBatchDefault
	}
	if c.MaxRecordBytes <= 0 {
		c.MaxRecordBytes = MaxRecordBytesDefault
	}
	if c.MaxImportBytes <= 0 {
		c.MaxImportBytes = MaxImportBytesDefault
	}
	if c.Lease <= 0 {
		c.Lease = LeaseDefault
	}
	if c.BackoffCap <= 0 {
		c.BackoffCap = pgoutbox.BackoffCapDefault
	}
	if c.Concurrency <= 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Disabled == nil {
		c.Disabled = map[string]string{}
	}
	if c.Solr == nil && c.Disabled[TargetSolr] == "" {
		c.Disabled[TargetSolr] = "not configured"
	}
	if c.SPARQL == nil && c.Disabled[TargetGraphDB] == "" {
		c.Disabled[TargetGraphDB] = "not configured"
	}
	return c
}

// FromEnv reads the projection's configuration from environment variables
// through getenv (os.Getenv in the binary). A target whose flag is on but
// whose required settings are missing stays off, and Disabled names the
// missing setting; the error lists every such problem (the rest of the
// configuration is still returned and usable).
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		APIToken:       getenv("PGOUTBOX_API_TOKEN"),
		CronSecret:     getenv("CRON_SECRET"),
		CronEnabled:    isOn(getenv("METAMUSEUM_OUTBOX_CRON_ENABLED")),
		Disabled:       map[string]string{},
		CronLimit:      envInt(getenv, "METAMUSEUM_OUTBOX_CRON_LIMIT"),
		MaxAttempts:    envInt(getenv, "OUTBOX_MAX_ATTEMPTS"),
		ImportBatch:    envInt(getenv, "PROJECTION_IMPORT_BATCH"),
		MaxRecordBytes: envInt(getenv, "PROJECTION_MAX_RECORD_BYTES"),
		MaxImportBytes: int64(envInt(getenv, "PROJECTION_IMPORT_MAX_BYTES")),
		Concurrency:    envInt(getenv, "OUTBOX_PROJECTION_CONCURRENCY"),
		Lease:          envDuration(getenv, "OUTBOX_LEASE_DURATION"),
		BackoffCap:     envDuration(getenv, "OUTBOX_BACKOFF_CAP"),
	}
	var problems []string
	if isOn(getenv("OUTBOX_PROJECT_TO_SOLR")) {
		sc := solr.Config{
			BaseURL:  getenv("SOLR_BASE_URL"),
			Core:     getenv("SOLR_CORE"),
			Username: getenv("SOLR_USERNAME"),
			Password: getenv("SOLR_PASSWORD"),
		}
		if ms := envInt(getenv, "SOLR_COMMIT_WITHIN_MS"); ms > 0 {
			sc.CommitWithin = time.Duration(ms) * time.Millisecond
		}
		if err := sc.Validate(); err != nil {
			msg := envMessage(err, "solr", solrEnv)
			c.Disabled[TargetSolr] = msg
			problems = append(problems, "OUTBOX_PROJECT_TO_SOLR=1 but "+msg)
		} else {
			c.Solr = &sc
		}
	} else {
		c.Disabled[TargetSolr] = "OUTBOX_PROJECT_TO_SOLR is not 1"
	}
	if isOn(getenv("OUTBOX_PROJECT_TO_GRAPHDB")) {
		gc := sparql.Config{
			UpdateURL:    getenv("GRAPHDB_UPDATE_URL"),
			BaseURL:      getenv("GRAPHDB_BASE_URL"),
			RepositoryID: getenv("GRAPHDB_REPOSITORY_ID"),
			Username:     getenv("GRAPHDB_USERNAME"),
			Password:     getenv("GRAPHDB_PASSWORD"),
			GraphPrefix:  getenv("GRAPHDB_GRAPH_PREFIX"),
			// GraphStoreURL, when set, replaces each graph by a Graph Store
			// Protocol PUT of N-Triples instead of a SPARQL Update.
			GraphStoreURL: getenv("GRAPHDB_GRAPH_STORE_URL"),
		}
		if err := gc.Validate(); err != nil {
			msg := envMessage(err, "sparql", sparqlEnv)
			c.Disabled[TargetGraphDB] = msg
			problems = append(problems, "OUTBOX_PROJECT_TO_GRAPHDB=1 but "+msg)
		} else {
			c.SPARQL = &gc
		}
	} else {
		c.Disabled[TargetGraphDB] = "OUTBOX_PROJECT_TO_GRAPHDB is not 1"
	}
	if len(problems) > 0 {
		return c, fmt.Errorf("projection: %s", strings.Join(problems, "; "))
	}
	return c, nil
}

// solrEnv and sparqlEnv name the environment variable FromEnv reads each
// target Config field from. The targets' errors name Go fields ("solr:
// Config.Core is empty"); envMessage renames them for an operator, who sets
// variables ("SOLR_CORE is empty").
var (
	solrEnv = map[string]string{
		"BaseURL":      "SOLR_BASE_URL",
		"Core":         "SOLR_CORE",
		"Username":     "SOLR_USERNAME",
		"Password":     "SOLR_PASSWORD",
		"CommitWithin": "SOLR_COMMIT_WITHIN_MS",
	}
	sparqlEnv = map[string]string{
		"UpdateURL":     "GRAPHDB_UPDATE_URL",
		"BaseURL":       "GRAPHDB_BASE_URL",
		"RepositoryID":  "GRAPHDB_REPOSITORY_ID",
		"Username":      "GRAPHDB_USERNAME",
		"Password":      "GRAPHDB_PASSWORD",
		"GraphPrefix":   "GRAPHDB_GRAPH_PREFIX",
		"GraphStoreURL": "GRAPHDB_GRAPH_STORE_URL",
	}
)

// configField matches a Go field as the targets' errors name it.
var configField = regexp.MustCompile(`\bConfig\.([A-Za-z]+)`)

// envMessage is a target's configuration error with its package prefix
// dropped and every Config field it names replaced by its variable in env
// (a field with no variable keeps its Go name).
func envMessage(err error, pkg string, env map[string]string) string {
	msg := strings.TrimPrefix(err.Error(), pkg+": ")
	return configField.ReplaceAllStringFunc(msg, func(m string) string {
		if name, ok := env[strings.TrimPrefix(m, "Config.")]; ok {
			return name
		}
		return m
	})
}

// isOn reads a boolean switch: "1", "true", "yes" or "on".
func isOn(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

func envInt(getenv func(string) string, name string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(getenv(name)))
	return n
}

func envDuration(getenv func(string) string, name string) time.Duration {
	d, _ := time.ParseDuration(strings.TrimSpace(getenv(name)))
	return d
}
