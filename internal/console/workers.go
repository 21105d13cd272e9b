package console

// GET /workers: the workers page (?format=json), served by the binary at
// that URL beside the console. Its queue numbers are internal/ops's (the
// ones of `pgoutbox status` and the overview); the record projection, when
// the binary runs it, adds its own state (projection.Status).

import (
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
	"github.com/pgoutbox/pgoutbox/projection"
)

// WorkersPath is the workers page's URL.
const WorkersPath = "/workers"

// CookiePath is the session cookie's path: the whole site, so that the
// workers page (WorkersPath, outside Prefix) reads a signed-in browser's
// session under the console's rules.
const CookiePath = "/"

// WorkersRefresh is how often the workers page refreshes itself.
const WorkersRefresh = 5 * time.Second

// workersAttentionLimit is how many dead letters, reconciliation records
// and blocked keys the workers page lists.
const workersAttentionLimit = 50

// WorkersConfig is what the binary tells the workers page about itself.
type WorkersConfig struct {
	// Served are the queues this process's workers (its Client) serve:
	// each is always listed, idle or not, and marked as served here.
	Served []string
	// Projection, when set, is the record projection this process runs:
	// the page adds its records, targets and next drain.
	Projection *projection.App
}

// WorkersReport is the content of GET /workers (and ?format=json). It holds
// aggregates, states and last errors only: never payloads or secrets.
type WorkersReport struct {
	GeneratedAt time.Time     `json:"generated_at"`
	Queues      []QueueReport `json:"queues"`
	// CompletedWindow names the window of the completed counts, throughput
	// and lag: ops.CompletedWindow, as `pgoutbox status` and the overview.
	CompletedWindow string `json:"completed_window"`
	// Served lists the queues whose workers run in this process.
	Served []string `json:"served"`
	// LiveWorkers are the live worker processes, from their heartbeats
	// (ops.LiveWorkers): this one and any other.
	LiveWorkers []ops.Worker `json:"live_workers"`
	// Projection is the record projection's state; absent when this
	// process does not run it.
	Projection *ProjectionState `json:"projection,omitempty"`
	// Attention lists dead letters and reconciliation records, newest first.
	Attention []AttentionItem `json:"attention"`
	// Blocked lists the ordering keys whose effects wait behind an earlier
	// effect of the key (docs/design.md, "Per-key ordering"), longest
	// waiting first; `pgoutbox blocked-keys` lists them too.
	Blocked []BlockedItem `json:"blocked_keys"`
	// StateNames maps the projection's old state names to the engine's.
	StateNames []projection.StateName `json:"state_names"`
	// RefreshSeconds is how often the page refreshes itself.
	RefreshSeconds int `json:"refresh_seconds"`
}

// QueueReport is one queue's backlog.
type QueueReport struct {
	Queue string `json:"queue"`
	// Served is true when this process's workers serve the queue.
	Served bool `json:"served"`
	// LiveWorkers counts the live worker processes (this one included)
	// that serve the queue.
	LiveWorkers int `json:"live_workers"`
	// States counts effects by state (every state is present). "completed"
	// counts only the effects completed within the window, like `pgoutbox
	// status`: a refresh never reads the retained history. A queue appears
	// when it has live, attention or recently completed effects, when a
	// live worker (this process or another) serves it, or when a worker
	// persisted a sample of it within the last hour: an idle queue stays
	// listed.
	States map[string]int64 `json:"states"`
	// Retrying counts available effects with attempts > 0 (old name "retry").
	Retrying int64 `json:"retrying"`
	// OldestAvailableAgeSeconds is how long the oldest claimable effect has
	// waited.
	OldestAvailableAgeSeconds float64 `json:"oldest_available_age_seconds"`
	// CompletedInWindow and ThroughputPerSecond measure the window
	// (ops.CompletedInWindow).
	CompletedInWindow   int64   `json:"completed_in_window"`
	ThroughputPerSecond float64 `json:"throughput_per_second"`
	// MeanLagSeconds is the mean creation → completion time of the
	// window's completions.
	MeanLagSeconds float64 `json:"mean_lag_seconds"`
}

// ProjectionState is the record projection's status.
type ProjectionState struct {
	projection.Status
	// LagSeconds is the age of the oldest record.upsert not yet projected.
	LagSeconds float64 `json:"lag_seconds"`
	// InProcessWorkers is true when this process's workers serve the
	// projection's queue (and a target is on).
	InProcessWorkers bool `json:"in_process_workers"`
	// LiveWorkers counts the live worker processes, anywhere, that serve
	// the projection's queue.
	LiveWorkers int `json:"live_workers"`
	// NextDrain is when the backlog is next worked, and by what.
	NextDrain projection.NextDrain `json:"next_drain"`
}

// BlockedItem is an ordering key held back by its head effect.
type BlockedItem struct {
	Queue       string    `json:"queue"`
	OrderingKey string    `json:"ordering_key"`
	Waiting     int64     `json:"waiting"`
	Since       time.Time `json:"oldest_waiting_since"`
	HeadID      int64     `json:"head_id"`
	HeadType    string    `json:"head_effect_type"`
	HeadState   string    `json:"head_state"`
	// Stuck: the head waits for an operator (a strict dead letter, a
	// reconciliation record).
	Stuck bool `json:"stuck"`
}

// AttentionItem is a dead letter or reconciliation record.
type AttentionItem struct {
	ID        int64     `json:"id"`
	Queue     string    `json:"queue"`
	Type      string    `json:"effect_type"`
	State     string    `json:"state"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	Since     time.Time `json:"since"`
}

// WorkersReport builds the workers page's content.
func (c *Console) WorkersReport(ctx context.Context, wc WorkersConfig) (WorkersReport, error) {
	now := time.Now().UTC()
	rep := WorkersReport{GeneratedAt: now, CompletedWindow: ops.CompletedWindowLabel, Served: slices.Sorted(slices.Values(wc.Served)),
		StateNames: projection.OldStateNames, RefreshSeconds: int(WorkersRefresh / time.Second)}
	if rep.Served == nil {
		rep.Served = []string{}
	}
	st, err := ops.Status(ctx, c.cfg.Pool, ops.StatusOptions{})
	if err != nil {
		return rep, err
	}
	done, err := ops.CompletedInWindow(ctx, c.cfg.Pool)
	if err != nil {
		return rep, err
	}
	if rep.LiveWorkers, err = ops.LiveWorkers(ctx, c.cfg.Pool); err != nil {
		return rep, err
	}
	queues := map[string]*QueueReport{}
	get := func(name string) *QueueReport {
		q, ok := queues[name]
		if !ok {
			q = &QueueReport{Queue: name, Served: slices.Contains(wc.Served, name), States: map[string]int64{}}
			for _, s := range projection.States {
				q.States[s] = 0
			}
			queues[name] = q
		}
		return q
	}
	for _, name := range wc.Served {
		get(name)
	}
	for _, w := range rep.LiveWorkers {
		for _, wq := range w.Queues {
			get(wq.Queue).LiveWorkers++
		}
	}
	if wc.Projection != nil {
		get(projection.Queue)
	}
	// Idle queues stay listed: every queue a worker sampled within the
	// chart window (the overview's samples), with zero counts.
	samples, err := store.RecentSamples(ctx, c.cfg.Pool, ChartWindow, "")
	if err != nil {
		return rep, err
	}
	for _, s := range samples {
		get(s.Queue)
	}
	for _, s := range st.Queues {
		q := get(s.Queue)
		q.States["available"], q.States["leased"], q.States["completed"] = s.Available, s.Leased, s.CompletedRecent
		q.States["dead_letter"], q.States["reconciliation_required"] = s.DeadLetter, s.ReconciliationRequired
		q.Retrying, q.OldestAvailableAgeSeconds = s.Retrying, s.OldestAvailableAgeSeconds
	}
	for _, d := range done {
		q := get(d.Queue)
		q.CompletedInWindow, q.ThroughputPerSecond, q.MeanLagSeconds = d.Completed, d.PerSecond, d.MeanLagSeconds
	}
	for _, name := range slices.Sorted(maps.Keys(queues)) {
		rep.Queues = append(rep.Queues, *queues[name])
	}

	attention, err := store.Attention(ctx, c.cfg.Pool, workersAttentionLimit)
	if err != nil {
		return rep, err
	}
	rep.Attention = make([]AttentionItem, 0, len(attention))
	for _, r := range attention {
		rep.Attention = append(rep.Attention, AttentionItem{ID: r.ID, Queue: r.Queue, Type: r.Type, State: r.State,
			Attempts: r.Attempts, LastError: short(r.LastError, 500), Since: r.Since})
	}
	blocked, err := ops.BlockedKeys(ctx, c.cfg.Pool, ops.BlockedOptions{Limit: workersAttentionLimit})
	if err != nil {
		return rep, err
	}
	rep.Blocked = make([]BlockedItem, 0, len(blocked.Keys))
	for _, k := range blocked.Keys {
		rep.Blocked = append(rep.Blocked, BlockedItem{Queue: k.Queue, OrderingKey: k.OrderingKey, Waiting: k.Waiting,
			Since: now.Add(-time.Duration(k.OldestWaitingSeconds * float64(time.Second))), HeadID: k.HeadID,
			HeadType: k.HeadType, HeadState: k.HeadState, Stuck: k.Stuck})
	}

	if app := wc.Projection; app != nil {
		ps, err := app.Status(ctx, now)
		if err != nil {
			return rep, err
		}
		p := &ProjectionState{Status: ps, InProcessWorkers: app.Enabled() && slices.Contains(wc.Served, projection.Queue),
			LiveWorkers: queues[projection.Queue].LiveWorkers}
		if p.LagSeconds, err = store.OldestPendingAge(ctx, c.cfg.Pool, projection.Queue); err != nil {
			return rep, err
		}
		by := ""
		switch {
		case p.InProcessWorkers:
			by = "the workers of this server"
		case p.LiveWorkers > 0:
			by = fmt.Sprintf("%d live worker process(es) elsewhere", p.LiveWorkers)
		}
		p.NextDrain = app.NextDrain(now, by)
		rep.Projection = p
	}
	return rep, nil
}

//go:embed workers.html
var workersHTML string

var workersTmpl = template.Must(template.New("workers").Funcs(template.FuncMap{
	"age": func(s float64) string {
		return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
	},
	"ts":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"rate": func(f float64) string { return fmt.Sprintf("%.2f/s", f) },
}).Parse(workersHTML))

// Workers returns the handler of GET /workers (mount it with the server's
// HandleOperatorSelfAuth at WorkersPath). It reads like the console's
// pages: open when the console is read-only, else with a live console
// session (the cookie of a signed-in browser) or the operator token as a
// bearer header (scripts). Without either, a browser asking for HTML is
// sent to the sign-in page and anything else answers 401; a wrong bearer
// answers 401, and 429 once the client's budget of wrong tokens is spent.
func (c *Console) Workers(wc WorkersConfig) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.workersAllowed(w, r) {
			return
		}
		rep, err := c.WorkersReport(r.Context(), wc)
		if err != nil {
			c.cfg.Logger.Error("workers report failed", "err", err)
			httpx.Error(w, http.StatusInternalServerError, "the report could not be built")
			return
		}
		if r.URL.Query().Get("format") == "json" {
			httpx.WriteJSON(w, http.StatusOK, rep)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := workersTmpl.Execute(w, rep); err != nil {
			c.cfg.Logger.Error("workers page failed", "err", err)
		}
	})
}

// workersAllowed authenticates a request of the workers page, answering
// it when refused.
func (c *Console) workersAllowed(w http.ResponseWriter, r *http.Request) bool {
	if c.ReadOnly() || c.sessionOf(r) != nil {
		return true
	}
	present, ok, wait := httpx.CheckBearer(c.limit, r, c.cfg.OperatorToken)
	switch {
	case ok:
		return true
	case !present && r.URL.Query().Get("format") != "json" && strings.Contains(r.Header.Get("Accept"), "text/html"):
		http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
	case wait > 0:
		secs := httpx.RetryAfter(w, wait)
		c.cfg.Logger.Warn("workers bearer token refused: too many wrong tokens", "remote", r.RemoteAddr, "retry_after_s", secs)
		httpx.Error(w, http.StatusTooManyRequests, "too many wrong operator tokens from your address; retry later")
	default:
		if present {
			c.cfg.Logger.Warn("workers bearer token refused: wrong operator token", "remote", r.RemoteAddr)
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="pgoutbox"`)
		httpx.Error(w, http.StatusUnauthorized, "sign in to the console, or send the operator token (PGOUTBOX_OPERATOR_TOKEN) as a bearer header")
	}
	return false
}
