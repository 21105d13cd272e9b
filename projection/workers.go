package projection

import (
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// WorkersRefresh is how often the /workers page refreshes itself.
const WorkersRefresh = 5 * time.Second

// throughputWindow is the window of /workers' throughput and lag.
const throughputWindow = 60 * time.Second

// attentionLimit is how many dead letters and reconciliation records
// /workers lists.
const attentionLimit = 50

// States lists the engine's states in display order.
var States = []string{"available", "leased", "completed", "dead_letter", "reconciliation_required"}

// OldStateNames maps the projection's older state names to the engine's.
var OldStateNames = []StateName{
	{Old: "pending", New: "available"},
	{Old: "processing", New: "leased"},
	{Old: "retry", New: "available with attempts > 0"},
	{Old: "processed", New: "completed"},
	{Old: "dead_letter", New: "dead_letter"},
}

// StateName is one old → new state-name mapping.
type StateName struct {
	Old string `json:"old"`
	New string `json:"new"`
}

// WorkersReport is the content of GET /workers (and ?format=json). It holds
// aggregates, states and last errors only: never payloads or secrets.
type WorkersReport struct {
	GeneratedAt time.Time       `json:"generated_at"`
	Queues      []QueueReport   `json:"queues"`
	Projection  ProjectionState `json:"projection"`
	// Attention lists dead letters and reconciliation records, newest first.
	Attention []AttentionItem `json:"attention"`
	// Blocked lists the ordering keys whose effects wait behind an earlier
	// effect of the key (docs/design.md, "Per-key ordering"), longest
	// waiting first; `pgoutbox blocked-keys` lists them too.
	Blocked []BlockedItem `json:"blocked_keys"`
	// StateNames maps the projection's old state names to the engine's.
	StateNames []StateName `json:"state_names"`
	// RefreshSeconds is how often the page refreshes itself.
	RefreshSeconds int `json:"refresh_seconds"`
}

// QueueReport is one queue's backlog.
type QueueReport struct {
	Queue string `json:"queue"`
	// States counts effects by state (every state is present). "completed"
	// counts only the effects completed within the last minute (the
	// throughput window), like `pgoutbox status`: a refresh never reads the
	// retained history. A queue appears when it has live, attention or
	// recently completed effects (outbox_events always does).
	States map[string]int64 `json:"states"`
	// Retrying counts available effects with attempts > 0 (old name "retry").
	Retrying int64 `json:"retrying"`
	// OldestAvailableAgeSeconds is how long the oldest claimable effect has
	// waited.
	OldestAvailableAgeSeconds float64 `json:"oldest_available_age_seconds"`
	// CompletedLastMinute and ThroughputPerSecond measure the last minute.
	CompletedLastMinute int64   `json:"completed_last_minute"`
	ThroughputPerSecond float64 `json:"throughput_per_second"`
	// MeanLagSeconds is the mean creation → completion time of the last
	// minute's completions.
	MeanLagSeconds float64 `json:"mean_lag_seconds"`
}

// ProjectionState is the projection's own status.
type ProjectionState struct {
	Records int64 `json:"records"`
	// LagSeconds is the age of the oldest record.upsert not yet projected.
	LagSeconds float64        `json:"lag_seconds"`
	Targets    []TargetStatus `json:"targets"`
	// InProcessWorkers is true when this server runs the outbox_events
	// workers.
	InProcessWorkers bool       `json:"in_process_workers"`
	Cron             CronStatus `json:"cron"`
	// NextDrain is when the backlog is next worked, and by what.
	NextDrain NextDrain `json:"next_drain"`
}

// TargetStatus says whether a target is on, and why not.
type TargetStatus struct {
	Name    string `json:"name"`
	Enabled bool   `json:"enabled"`
	Reason  string `json:"reason,omitempty"`
}

// CronStatus describes the cron drain.
type CronStatus struct {
	Enabled bool `json:"enabled"`
	// Reason says why the endpoint would not run a cycle.
	Reason string `json:"reason,omitempty"`
	// ScheduleSeconds is the scheduler's period.
	ScheduleSeconds int64 `json:"schedule_seconds"`
	// NextWakeUp is the next scheduled call (the period aligned to the hour,
	// like "*/5 * * * *").
	NextWakeUp time.Time `json:"next_wake_up"`
	Limit      int       `json:"limit"`
	SecretSet  bool      `json:"secret_set"`
}

// NextDrain is the effective next time the backlog is worked.
type NextDrain struct {
	// At is nil when nothing will work the backlog.
	At  *time.Time `json:"at"`
	By  string     `json:"by"`
	Why string     `json:"why,omitempty"`
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

// Report builds the /workers content.
func (a *App) Report(ctx context.Context) (WorkersReport, error) {
	now := time.Now().UTC()
	rep := WorkersReport{GeneratedAt: now, StateNames: OldStateNames, RefreshSeconds: int(WorkersRefresh / time.Second)}
	queues := map[string]*QueueReport{}
	get := func(name string) *QueueReport {
		q, ok := queues[name]
		if !ok {
			q = &QueueReport{Queue: name, States: map[string]int64{}}
			for _, s := range States {
				q.States[s] = 0
			}
			queues[name] = q
		}
		return q
	}
	get(Queue) // always shown
	// The engine's aggregate (store.Stats): every arm of its WHERE matches a
	// partial index, so a refresh reads the live backlog and the last
	// window's completions, never the retained history.
	stats, err := store.Stats(ctx, a.pool, store.OpsFilter{}, 0, throughputWindow)
	if err != nil {
		return rep, err
	}
	for _, s := range stats {
		if !s.QueueTotal {
			continue
		}
		q := get(s.Queue)
		q.States[s.State] = s.Count
		q.Retrying += s.Retrying
		if s.OldestAvailableAge > q.OldestAvailableAgeSeconds {
			q.OldestAvailableAgeSeconds = s.OldestAvailableAge
		}
	}
	tput, err := store.Throughput(ctx, a.pool, throughputWindow)
	if err != nil {
		return rep, err
	}
	for _, t := range tput {
		q := get(t.Queue)
		q.CompletedLastMinute, q.MeanLagSeconds = t.Completed, t.MeanLag
		q.ThroughputPerSecond = float64(t.Completed) / throughputWindow.Seconds()
	}
	for _, q := range queues {
		rep.Queues = append(rep.Queues, *q)
	}
	sort.Slice(rep.Queues, func(i, j int) bool { return rep.Queues[i].Queue < rep.Queues[j].Queue })

	attention, err := store.Attention(ctx, a.pool, attentionLimit)
	if err != nil {
		return rep, err
	}
	rep.Attention = make([]AttentionItem, 0, len(attention))
	for _, r := range attention {
		it := AttentionItem{ID: r.ID, Queue: r.Queue, Type: r.Type, State: r.State, Attempts: r.Attempts,
			LastError: r.LastError, Since: r.Since}
		if len(it.LastError) > 500 {
			it.LastError = it.LastError[:500] + "…"
		}
		rep.Attention = append(rep.Attention, it)
	}

	blocked, err := store.BlockedKeys(ctx, a.pool, "", false, attentionLimit)
	if err != nil {
		return rep, err
	}
	rep.Blocked = make([]BlockedItem, 0, len(blocked))
	for _, k := range blocked {
		rep.Blocked = append(rep.Blocked, BlockedItem{Queue: k.Queue, OrderingKey: k.OrderingKey, Waiting: k.Waiting,
			Since: k.OldestWaiting, HeadID: k.HeadID, HeadType: k.HeadType, HeadState: k.HeadState,
			Stuck: k.Stuck()})
	}

	p := &rep.Projection
	if p.Records, err = CountRecords(ctx, a.pool); err != nil {
		return rep, err
	}
	if p.LagSeconds, err = store.OldestPendingAge(ctx, a.pool, Queue); err != nil {
		return rep, err
	}
	for _, name := range []string{TargetSolr, TargetGraphDB} {
		ts := TargetStatus{Name: name, Enabled: a.targetOn(name)}
		if !ts.Enabled {
			ts.Reason = a.cfg.Disabled[name]
		}
		p.Targets = append(p.Targets, ts)
	}
	p.InProcessWorkers = a.cfg.InProcessWorkers && a.Enabled()
	p.Cron = CronStatus{
		Enabled:         a.cronDisabledReason() == "",
		Reason:          a.cronDisabledReason(),
		ScheduleSeconds: int64(a.cfg.CronSchedule / time.Second),
		NextWakeUp:      NextWakeUp(now, a.cfg.CronSchedule),
		Limit:           a.cfg.CronLimit,
		SecretSet:       a.cfg.CronSecret != "",
	}
	switch {
	case !a.Enabled():
		p.NextDrain = NextDrain{By: "nothing", Why: "no projection target is enabled: records wait in the queue"}
	case p.InProcessWorkers:
		at := now
		p.NextDrain = NextDrain{At: &at, By: "the workers of this server (continuous)"}
	case p.Cron.Enabled && p.Cron.SecretSet:
		at := p.Cron.NextWakeUp
		p.NextDrain = NextDrain{At: &at, By: fmt.Sprintf("the cron endpoint (up to %d effects)", a.cfg.CronLimit)}
	default:
		why := p.Cron.Reason
		if why == "" {
			why = "CRON_SECRET is not set"
		}
		p.NextDrain = NextDrain{By: "`pgoutbox projector drain` run by hand", Why: "the cron drain is off: " + why}
	}
	return rep, nil
}

// NextWakeUp is the next multiple of period after now (UTC, aligned to the
// Unix epoch, which for divisors of an hour is "*/N * * * *").
func NextWakeUp(now time.Time, period time.Duration) time.Time {
	if period <= 0 {
		period = CronScheduleDefault
	}
	return now.UTC().Truncate(period).Add(period)
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

func (a *App) workers(w http.ResponseWriter, r *http.Request) {
	rep, err := a.Report(r.Context())
	if err != nil {
		a.cfg.Logger.Error("workers report failed", "err", err)
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
		a.cfg.Logger.Error("workers page failed", "err", err)
	}
}
