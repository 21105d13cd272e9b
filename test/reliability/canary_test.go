package reliability

import (
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

// Scenario 10: every secret is a unique canary (webhook secret, API token,
// cron secret, the database password in DATABASE_URL, the Solr password,
// the token in the alert webhook URL, the GitHub App private key, and every
// installation token and app JWT the emulator hands out), the binary runs at
// debug log level through the whole story — installation, releases (one
// whose dispatch answer is lost, one whose check run is refused), records
// projected to Solr, the cron endpoint, every bad input of scenario 9, and
// the operator commands — and then no canary appears in any table, log
// line, command output, HTTP answer or alert.
func TestCanarySecretsNeverLeak(t *testing.T) {
	long(t)
	ctx := timeout(t, 5*time.Minute)
	bin := buildBinary(t, t.TempDir())
	s := newStack(t, ctx, bin)
	emu := s.emu
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	waitDB := func(what, sql string, want int64) {
		t.Helper()
		waitFor(t, ctx, what, 50*time.Millisecond, func() bool { return s.scalar(t, sql) >= want })
	}
	waitEmu := func(what string, cond func(fakegh.Snapshot) bool) {
		t.Helper()
		if err := emu.Wait(ctx, cond); err != nil {
			t.Fatalf("waiting for %s: %v\n%s", what, err, tail2(s.srv.out.String(), 30))
		}
	}

	// Installation.
	must(emu.AddInstallation(installationID, "acme"))
	must(emu.AddRepository(installationID, repoID, repoName))
	_, err := emu.DeliverWebhook(ctx, "installation", map[string]any{
		"action":       "created",
		"installation": map[string]any{"id": installationID, "account": map[string]any{"login": "acme", "id": 1}},
		"repositories": []any{map[string]any{"id": repoID, "full_name": repoName, "name": "api"}},
	})
	must(err)
	waitDB("the repository installed", `SELECT count(*) FROM control_plane.repositories WHERE state = 'active'`, 1)

	// Release 1: the whole lifecycle.
	_, err = emu.Push(ctx, repoName, "refs/tags/v1.0.0", strings.Repeat("1", 40))
	must(err)
	waitEmu("check run and dispatch", func(sn fakegh.Snapshot) bool { return len(sn.CheckRuns) == 1 && len(sn.Dispatches) == 1 })
	runID := emu.Dispatches()[0].RunID
	waitDB("workflow_run_id persisted", fmt.Sprintf(`SELECT count(*) FROM control_plane.execution_attempts WHERE workflow_run_id = %d`, runID), 1)
	_, err = emu.CompleteRun(ctx, runID, "success")
	must(err)
	waitEmu("check run concluded", func(sn fakegh.Snapshot) bool { return sn.CheckRuns[0].Status == "completed" })

	// Release 2: the dispatch happens but its answer is lost → reconciliation.
	emu.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Kind: fakegh.FaultLoseResponse, Times: 1})
	_, err = emu.Push(ctx, repoName, "refs/tags/v2.0.0", strings.Repeat("2", 40))
	must(err)
	waitDB("a reconciliation record", `SELECT count(*) FROM pgoutbox.effects WHERE state = 'reconciliation_required'`, 1)

	// Release 3: the check run is refused (permanent) → dead letter.
	emu.InjectFault(fakegh.FaultRule{Route: fakegh.RouteCreateCheckRun, Kind: fakegh.FaultStatus, Status: http.StatusForbidden,
		Body: `{"message":"Resource not accessible by integration","documentation_url":"https://docs.github.com"}`, Times: 1})
	_, err = emu.Push(ctx, repoName, "refs/tags/v3.0.0", strings.Repeat("3", 40))
	must(err)
	waitDB("a dead letter", `SELECT count(*) FROM pgoutbox.effects WHERE state = 'dead_letter'`, 1)

	// Records, projected to Solr (basic auth), and the cron endpoint.
	bearer := "Bearer " + s.canaries["PGOUTBOX_API_TOKEN"]
	for i := range 3 {
		req, _ := http.NewRequest(http.MethodPost, s.srv.url+"/api/records", strings.NewReader(fmt.Sprintf(`{"id":"r%d","title":"Record %d"}`, i, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", bearer)
		if code, _, body := s.do(t, req); code/100 != 2 {
			t.Fatalf("POST /api/records: %d %s", code, body)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, s.srv.url+"/api/import", strings.NewReader("{\"id\":\"r10\"}\n{\"id\":\"r11\"}\n"))
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Authorization", bearer)
	if code, _, body := s.do(t, req); code/100 != 2 {
		t.Fatalf("POST /api/import: %d %s", code, body)
	}
	req, _ = http.NewRequest(http.MethodGet, s.srv.url+"/api/cron/outbox", nil)
	req.Header.Set("Authorization", "Bearer "+s.canaries["CRON_SECRET"])
	if code, _, body := s.do(t, req); code != http.StatusOK {
		t.Fatalf("GET /api/cron/outbox: %d %s", code, body)
	}
	waitDB("records projected", `SELECT count(*) FROM pgoutbox.effect_states WHERE queue = 'outbox_events' AND state = 'completed'`, 5)
	for _, path := range []string{"/workers", "/workers?format=json", "/metrics", "/api/records?q=Record"} {
		req, _ := http.NewRequest(http.MethodGet, s.srv.url+path, nil)
		req.Header.Set("Authorization", bearer)
		s.do(t, req)
	}

	// Every bad input of scenario 9, logged at debug level.
	for _, c := range badInputCases(s) {
		s.do(t, c.req())
	}

	// The operator commands, including the alert webhook's error path and
	// GitHub calls (reconcile inspect).
	var outputs []string
	var reconID, deadID int64
	must(s.admin.QueryRow(ctx, `SELECT id FROM pgoutbox.effects WHERE state = 'reconciliation_required' LIMIT 1`).Scan(&reconID))
	must(s.admin.QueryRow(ctx, `SELECT id FROM pgoutbox.effects WHERE state = 'dead_letter' LIMIT 1`).Scan(&deadID))
	for _, args := range [][]string{
		{"status", "--json"}, {"status"}, {"dlq", "list", "--json"}, {"dlq", "list"},
		{"reconcile", "list", "--json"}, {"reconcile", "inspect", fmt.Sprint(reconID), "--json"},
		{"alert", "check", "--json"}, {"alert", "check"}, {"readiness", "broker", "--json"},
		{"requeue-stale", "--json"}, {"dlq", "replay", "--id", fmt.Sprint(deadID), "--json"},
		{"readiness", "projection", "--active-discovery-workflows", "0", "--active-graph-workflows", "0",
			"--search-p95-ms", "10", "--graph-p95-ms", "10", "--json"},
	} {
		stdout, stderr, code := cli(t, bin, append(s.env, "OUTBOX_ALERT_FAIL_ON_ALERT=0"), args...)
		outputs = append(outputs, stdout, stderr)
		if code == 1 {
			t.Logf("pgoutbox %s exited 1: %s", strings.Join(args, " "), strings.TrimSpace(stderr))
		}
	}
	if len(s.alertRx) == 0 {
		t.Errorf("alert check never posted to OUTBOX_ALERT_WEBHOOK_URL (firing rules expected: a dead letter, a reconciliation record)")
	}
	waitDB("the replayed dead letter completed", fmt.Sprintf(`SELECT count(*) FROM pgoutbox.effect_states WHERE id = %d AND state = 'completed'`, deadID), 1)
	s.srv.stop(t, ctx)
	s.db.checkStorage(t, ctx)

	// The corpus: logs, outputs, answers, alerts, and every table.
	type source struct{ name, text string }
	corpus := []source{{"serve log", s.srv.out.String()}}
	for i, o := range outputs {
		corpus = append(corpus, source{fmt.Sprintf("command output %d", i), o})
	}
	s.mu.Lock()
	for i, b := range s.bodies {
		corpus = append(corpus, source{fmt.Sprintf("HTTP answer %d", i), b})
	}
	for i, b := range s.alertRx {
		corpus = append(corpus, source{fmt.Sprintf("alert %d", i), b})
	}
	issued := append([]string(nil), s.issued...)
	s.mu.Unlock()
	tables, rowsScanned := 0, 0
	rows, err := s.admin.Query(ctx, `SELECT table_schema, table_name FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2`)
	must(err)
	names, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var n [2]string
		return n, r.Scan(&n[0], &n[1])
	})
	must(err)
	for _, n := range names {
		ident := pgx.Identifier{n[0], n[1]}.Sanitize()
		rows, err := s.admin.Query(ctx, `SELECT t::text FROM `+ident+` t`)
		must(err)
		texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		must(err)
		tables++
		rowsScanned += len(texts)
		corpus = append(corpus, source{"table " + n[0] + "." + n[1], strings.Join(texts, "\n")})
	}

	// The canaries.
	canaries := map[string]string{}
	for k, v := range s.canaries {
		canaries[k] = v
	}
	block, _ := pem.Decode(emu.AppPrivateKeyPEM())
	body := base64.StdEncoding.EncodeToString(block.Bytes)
	for i := 0; i+48 <= len(body); i += 48 { // any 48-character run of the key's base64
		canaries[fmt.Sprintf("GITHUB_APP_PRIVATE_KEY[%d]", i)] = body[i : i+48]
	}
	seenTok := map[string]bool{}
	for _, tok := range issued {
		if len(tok) >= 16 && !seenTok[tok] {
			seenTok[tok] = true
			canaries[fmt.Sprintf("GitHub credential %d (installation token or app JWT)", len(seenTok))] = tok
		}
	}
	tokens := len(seenTok)
	if tokens == 0 {
		t.Errorf("no installation token or JWT was seen on the wire; the GitHub part of the story did not run")
	}
	bytesScanned, hits := 0, 0
	for _, src := range corpus {
		bytesScanned += len(src.text)
		for name, c := range canaries {
			if strings.Contains(src.text, c) {
				hits++
				i := strings.Index(src.text, c)
				t.Errorf("canary %s found in %s: …%s…", name, src.name, src.text[max(0, i-80):min(len(src.text), i+len(c)+40)])
			}
		}
	}
	logLines := strings.Count(s.srv.out.String(), "\n")
	for _, want := range []string{"level=WARN msg=\"delivery failed\"", "state=reconciliation_required", "state=dead_letter"} {
		if !strings.Contains(s.srv.out.String(), want) {
			t.Errorf("the serve log lacks %q: the failure paths did not run", want)
		}
	}
	report(t, "10 canary secrets", figures{
		"canaries": len(canaries), "github_tokens_and_jwts": tokens, "serve_log_lines": logLines,
		"tables": tables, "rows": rowsScanned, "http_answers": len(s.bodies), "commands": len(outputs) / 2,
		"alerts_posted": len(s.alertRx), "bytes_scanned": bytesScanned, "hits": hits,
		"reconciliation_records": s.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'reconciliation_required'`),
	})
}
