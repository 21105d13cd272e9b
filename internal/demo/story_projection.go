package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/solr"
	fakesolr "github.com/pgoutbox/pgoutbox/adapters/solr/solrtest"
	"github.com/pgoutbox/pgoutbox/adapters/sparql"
	"github.com/pgoutbox/pgoutbox/projection"
)

// The projection story's numbers.
const (
	solrCore = "records"
	// burst503 is how many Solr update requests answer 503 before it
	// recovers.
	burst503 = 25
)

// projectionStory drives the record projection: an NDJSON import projected
// to the Solr emulator through a burst of 503s, with one poisoned record.
type projectionStory struct {
	d     *Demo
	app   *projection.App
	solr  *fakesolr.Server
	token string
}

func newProjectionStory(d *Demo, cfg *pgoutbox.Config) (*projectionStory, error) {
	p := &projectionStory{d: d, token: randomHex(16)}
	p.solr = fakesolr.New(fakesolr.Options{Cores: []string{solrCore}})
	pc := projection.Config{
		APIToken:    p.token,
		Solr:        &solr.Config{BaseURL: p.solr.URL(), Core: solrCore},
		MaxAttempts: 8,
		BackoffCap:  BackoffCapDefault,
		Logger:      d.o.Log,
	}
	if d.o.SPARQLURL != "" {
		pc.SPARQL = &sparql.Config{UpdateURL: d.o.SPARQLURL}
	}
	app, err := projection.New(d.o.Pool, pc)
	if err != nil {
		p.solr.Close()
		return nil, err
	}
	app.Routes(d.srv)
	p.app = app
	for q, qc := range app.Queues() {
		cfg.Queues[q] = qc
	}
	cfg.Types = append(cfg.Types, app.EffectTypes()...)
	return p, nil
}

// ProjectionExpectations are the queue/state counts the projection story
// ends with for an import of n records: all but the poisoned one
// completed, the poisoned one dead-lettered.
func ProjectionExpectations(n int) map[string]int64 {
	return map[string]int64{
		projection.Queue + "/completed":   int64(n - 1),
		projection.Queue + "/dead_letter": 1,
	}
}

// poisonID is the record whose year Solr refuses (a year_i that is not a
// number): a permanent 400 that dead-letters at once.
func (p *projectionStory) poisonID() string { return "demo-" + p.d.run + "-poison" }

// writeImport generates the NDJSON file: n-1 records and the poisoned one.
func (p *projectionStory) writeImport(n int) (string, error) {
	f, err := os.CreateTemp("", "pgoutbox-demo-*.ndjson")
	if err != nil {
		return "", err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	subjects := []string{"maps", "letters", "photographs", "ledgers", "posters", "herbaria"}
	for i := range n - 1 {
		rec := map[string]any{
			"id":        fmt.Sprintf("demo-%s-%05d", p.d.run, i),
			"title":     fmt.Sprintf("Object %d of the %s collection", i, subjects[i%len(subjects)]),
			"subject_s": subjects[i%len(subjects)],
			"year_i":    1850 + i%170,
			"demo_run":  p.d.run,
		}
		if err := enc.Encode(rec); err != nil {
			return "", err
		}
	}
	if err := enc.Encode(map[string]any{"id": p.poisonID(), "title": "A record Solr refuses", "year_i": "circa 1900",
		"demo_run": p.d.run}); err != nil {
		return "", err
	}
	return f.Name(), nil
}

func (p *projectionStory) run(ctx context.Context) error {
	n := p.d.o.Records
	path, err := p.writeImport(n)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	p.solr.InjectFault(fakesolr.FaultRule{Handler: "update", Kind: fakesolr.FaultStatus, Status: http.StatusServiceUnavailable, Times: burst503})
	p.d.say("record projection: importing %d records (NDJSON, %s) through POST /api/import; Solr will answer 503 %d times first",
		n, filepath.Base(path), burst503)
	res, err := p.postImport(ctx, path)
	if err != nil {
		return err
	}
	p.d.say("record projection: import wrote %d records (%d unchanged, %d rejected); each has a record.upsert effect", res.Written, res.Unchanged, res.Rejected)
	err = waitFor(ctx, "the projection to drain", func() (bool, error) {
		n, err := p.d.countRun(ctx, projection.Queue, "available", "leased")
		return n == 0, err
	})
	if err != nil {
		return err
	}
	dead, err := p.d.countRun(ctx, projection.Queue, "dead_letter")
	if err != nil {
		return err
	}
	p.d.say("record projection: %d documents in Solr after the 503 burst was retried; %d poisoned record dead-lettered (%s: Solr refuses year_i=\"circa 1900\")",
		p.solr.Count(solrCore), dead, p.poisonID())
	return nil
}

// importResult is the part of the import answer the story reports.
type importResult struct {
	Written   int64 `json:"written"`
	Unchanged int64 `json:"unchanged"`
	Rejected  int64 `json:"rejected"`
}

func (p *projectionStory) postImport(ctx context.Context, path string) (importResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return importResult{}, err
	}
	defer f.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.d.base+"/api/import", f)
	if err != nil {
		return importResult{}, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return importResult{}, fmt.Errorf("import: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return importResult{}, fmt.Errorf("import: %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var r importResult
	if err := json.Unmarshal(body, &r); err != nil {
		return importResult{}, fmt.Errorf("import answer: %w", err)
	}
	return r, nil
}

func (p *projectionStory) close() { p.solr.Close() }
