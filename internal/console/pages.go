package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/live.js
var liveJS []byte

// liveScript serves the live-refresh script (static, no secret: served
// without a session).
func liveScript(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(liveJS)
}

// livePages are the pages that refresh themselves (the ones without a
// form inside what is refreshed).
var livePages = map[string]bool{"overview": true, "effects": true}

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"when": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			return v.UTC().Format("2006-01-02 15:04:05 UTC")
		case *time.Time:
			if v == nil {
				return "-"
			}
			return v.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		return "-"
	},
	"subject": func(b []byte) string { return ops.ParseSubject(b).String() },
	"status":  rowStatus,
	"ago":     ago,
	"sub": func(a int64, bs ...int64) int64 {
		for _, b := range bs {
			a -= b
		}
		return max(a, 0)
	},
	"redact": RedactError,
	"dict": func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
	"short": func(s string, n int) string {
		if r := []rune(s); len(r) > n {
			return string(r[:n-1]) + "…"
		}
		return s
	},
}).ParseFS(templateFS, "templates/*.html"))

// States are the effect states the list filter offers.
var States = []string{"available", "leased", "completed", "dead_letter", "reconciliation_required"}

// view is what every page template gets.
type view struct {
	Title    string
	ReadOnly bool
	SignedIn bool
	Operator string
	CSRF     string
	States   []string
	// Live is the live-refresh interval in milliseconds, 0 on pages that
	// do not refresh; LiveText says it to the reader.
	Live     int64
	LiveText string
	Data     any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	v := view{Title: title, ReadOnly: c.ReadOnly(), States: States, Data: data}
	if livePages[name] && status == http.StatusOK && c.cfg.LiveRefresh > 0 {
		v.Live, v.LiveText = c.cfg.LiveRefresh.Milliseconds(), c.cfg.LiveRefresh.String()
	}
	if s := c.sessionOf(r); s != nil {
		v.SignedIn, v.Operator, v.CSRF = true, s.operator, s.csrf
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.WriteHeader(status)
	if err := pages.ExecuteTemplate(w, name, v); err != nil {
		c.cfg.Logger.Error("console page failed", "page", name, "err", err)
	}
}

// refuse answers status with a page saying why; nothing was changed.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "message", http.StatusText(status), message{Text: msg, Error: true})
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	c.cfg.Logger.Error("console query failed", "path", r.URL.Path, "err", err)
	c.refuse(w, r, http.StatusInternalServerError, "The database query failed; see the server log.")
}

// message is the data of the "message" page.
type message struct {
	Text  string
	Error bool
	Back  string
}

// listData is the data of the effects, dead-letter and reconciliation
// pages.
type listData struct {
	Filter  store.EffectFilter
	Rows    []store.EffectRow
	NextURL string
	// FixedState hides the state filter (dead letters, reconciliation).
	FixedState bool
	// Pause and Unserved describe the filtered queue: paused (no claim
	// takes its effects), or holding effects no live worker works.
	Pause    *ops.QueuePause
	Unserved bool
}

func pageSize(r *http.Request) (int, error) {
	s := r.URL.Query().Get("limit")
	if s == "" {
		return PageSizeDefault, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > PageSizeMax {
		return 0, fmt.Errorf("limit must be 1..%d, got %q", PageSizeMax, s)
	}
	return n, nil
}

// list reads the filters and the page position of r and loads the rows.
func (c *Console) list(w http.ResponseWriter, r *http.Request, state string, path string) (*listData, bool) {
	q := r.URL.Query()
	f := store.EffectFilter{Queue: q.Get("queue"), State: q.Get("state"), Type: q.Get("type"),
		KeyPrefix: q.Get("key"), ErrorText: q.Get("error"), OrderingKey: q.Get("ordering_key")}
	d := &listData{}
	if state != "" {
		f.State, d.FixedState = state, true
	}
	if f.State != "" && !slices.Contains(States, f.State) {
		c.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("Unknown state %q: one of %s.", f.State, strings.Join(States, ", ")))
		return nil, false
	}
	var before int64
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			c.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("before must be a positive effect id, got %q.", s))
			return nil, false
		}
		before = n
	}
	limit, err := pageSize(r)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return nil, false
	}
	rows, err := store.ListEffects(r.Context(), c.cfg.Pool, f, before, limit+1)
	if err != nil {
		c.fail(w, r, err)
		return nil, false
	}
	d.Filter = f
	if len(rows) > limit {
		rows = rows[:limit]
		next := url.Values{}
		for k, v := range map[string]string{"queue": f.Queue, "type": f.Type, "key": f.KeyPrefix, "error": f.ErrorText,
			"ordering_key": f.OrderingKey} {
			if v != "" {
				next.Set(k, v)
			}
		}
		if f.State != "" && !d.FixedState {
			next.Set("state", f.State)
		}
		if q.Get("limit") != "" {
			next.Set("limit", strconv.Itoa(limit))
		}
		next.Set("before", strconv.FormatInt(rows[len(rows)-1].ID, 10))
		d.NextURL = path + "?" + next.Encode()
	}
	d.Rows = rows
	if f.Queue != "" {
		if err := c.queueState(r.Context(), d); err != nil {
			c.fail(w, r, err)
			return nil, false
		}
	}
	return d, true
}

// queueState fills the filtered queue's pause and unserved flag.
func (c *Console) queueState(ctx context.Context, d *listData) error {
	ps, err := ops.PausedQueues(ctx, c.cfg.Pool)
	if err != nil {
		return err
	}
	for i := range ps {
		if ps[i].Queue == d.Filter.Queue {
			d.Pause = &ps[i]
		}
	}
	un, err := ops.UnservedQueues(ctx, c.cfg.Pool)
	if err != nil {
		return err
	}
	for _, u := range un {
		d.Unserved = d.Unserved || u.Queue == d.Filter.Queue
	}
	return nil
}

func (c *Console) effectsPage(w http.ResponseWriter, r *http.Request) {
	if d, ok := c.list(w, r, "", "/console/effects"); ok {
		c.render(w, r, http.StatusOK, "effects", "Effects", d)
	}
}

func (c *Console) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	if d, ok := c.list(w, r, "dead_letter", "/console/dead-letters"); ok {
		c.render(w, r, http.StatusOK, "deadletters", "Dead letters", d)
	}
}

func (c *Console) reconciliationPage(w http.ResponseWriter, r *http.Request) {
	if d, ok := c.list(w, r, "reconciliation_required", "/console/reconciliation"); ok {
		c.render(w, r, http.StatusOK, "reconciliation", "Reconciliation records", d)
	}
}

// detailData is the data of the effect page.
type detailData struct {
	E       store.EffectDetail
	Subject ops.Subject
	Payload string
	// Resolution is the recorded resolution (JSON, redacted), if any.
	Resolution string
	LastError  string
	// Reconcile: the record is a dispatch the control plane can act on.
	Reconcile    bool
	ControlPlane bool
	GitHub       bool
	Inspection   *controlplane.Inspection
	InspectError string
	// Timeline is the effect's history, oldest first (ops.EffectHistory,
	// the timeline of `pgoutbox effect history`): enqueued, each recorded
	// failed attempt and replay (pgoutbox.effect_attempts), the console
	// actions that named it, the last claim, delivery start and the
	// outcome; each Detail redacted.
	Timeline []ops.HistoryEvent
	// TimelineCut: more than AttemptsShown attempts or console actions are
	// recorded; only the newest are shown.
	TimelineCut bool
	// Head is the effect that holds this one back (its ordering key's
	// blocking head), nil when none.
	Head *store.KeyHead
	// Cancellable: available or dead letter, delivery never started, a
	// row of pgoutbox.effects (a cancel does not reach an effect of a
	// batch queue still in the stream).
	Cancellable bool
	// Cancel is the recorded cancellation, nil when not cancelled.
	Cancel *ops.Cancellation
	// Status is the state in words (scheduled, retrying, waiting).
	Status status
}

// AttemptsShown is how many recorded attempts, and how many console
// actions, an effect's page shows (the newest).
const AttemptsShown = 200

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("invalid effect id %q", r.PathValue("id"))
	}
	return id, nil
}

func (c *Console) effectPage(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	hist, ok, err := ops.EffectHistory(r.Context(), c.cfg.Pool, id, AttemptsShown)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if !ok {
		c.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No effect %d.", id))
		return
	}
	e := hist.Effect
	d := detailData{E: e, Subject: ops.ParseSubject(e.Payload), Payload: RedactPayload(e.Payload),
		ControlPlane: c.cfg.ControlPlane != nil, GitHub: c.cfg.GitHub}
	if e.LastError != nil {
		d.LastError = RedactError(*e.LastError)
	}
	for i := range hist.Events { // errors and operators' recorded outcomes
		hist.Events[i].Detail = RedactError(hist.Events[i].Detail)
	}
	d.Timeline, d.TimelineCut = hist.Events, hist.Cut
	d.Cancel = ops.CancellationOf(e.Resolution)
	d.Cancellable = (e.State == "available" || e.State == "dead_letter") && e.DeliveryStartedAt == nil &&
		e.Storage == store.StorageRows
	if e.OrderingKey != nil && e.State == "available" {
		h, found, err := store.HeadOf(r.Context(), c.cfg.Pool, id)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		if found {
			d.Head = &h
		}
	}
	d.Status = rowStatus(store.EffectRow{State: e.State, Attempts: e.Attempts, MaxAttempts: e.MaxAttempts, DueAt: e.AvailableAt,
		Waiting: d.Head != nil, Cancelled: d.Cancel != nil})
	if e.Resolution != nil {
		d.Resolution = RedactPayload(e.Resolution)
	}
	d.Reconcile = e.State == "reconciliation_required" && e.Type == controlplane.TypeWorkflowDispatch
	if d.Reconcile && c.cfg.ControlPlane != nil && c.cfg.GitHub {
		in, err := c.cfg.ControlPlane.Inspect(r.Context(), id)
		if err != nil {
			d.InspectError = err.Error()
		} else {
			d.Inspection = &in
		}
	}
	c.render(w, r, http.StatusOK, "effect", fmt.Sprintf("Effect %d", id), d)
}

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) {
	limit, err := pageSize(r)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	rows, err := store.ListAudit(r.Context(), c.cfg.Pool, limit)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "audit", "Audit", rows)
}

// who is the audit's operator and session columns for s.
func who(s *session) (string, string) { return s.operator, s.digest[:12] }

// audit records an action outside a transaction of its own (reconcile:
// the control plane commits its change first). A failure is logged: the
// action already happened.
func (c *Console) audit(ctx context.Context, s *session, action, target string, changed int, outcome string) {
	op, sess := who(s)
	e := store.AuditEntry{Operator: op, Session: sess, Action: action, Target: target, Changed: changed, Outcome: short(outcome, 2000)}
	if err := store.InsertAudit(context.WithoutCancel(ctx), c.cfg.Pool, e); err != nil {
		c.cfg.Logger.Error("console audit failed", "action", action, "target", target, "err", err)
	}
	c.cfg.Logger.Info("console action", "operator", op, "session", sess, "action", action, "target", target,
		"changed", changed, "outcome", e.Outcome)
}

func short(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// confirmData is the data of the replay confirmation and result pages.
type confirmData struct {
	Mode  string // "ids" or "queue"
	IDs   []int64
	Queue string
	// Count is the number that will move (confirmation) or that was
	// confirmed (result).
	Count int64
	// Move is every id the confirmation will replay (its hidden fields),
	// Moving the first PageSizeDefault of them with their keys and errors,
	// and QueueTotal the queue's dead letters (mode "queue").
	Move       []int64
	Moving     []store.EffectRow
	More       int   // len(Move) - len(Moving)
	Last       int64 // the highest id in Move
	QueueTotal int64
	Skipped    []ops.Skipped
	Result     *ops.ReplayResult
}

// replay replays dead letters in two steps. The first POST (no confirm)
// finds what would move, lists it and asks; its form names exactly those
// effects (ids, whatever the mode), and the second POST (confirm=N)
// replays at most N of them that are still dead letters, and records the
// audit row in the replay's transaction. An effect that was not among
// them (one that dead-lettered after the page was shown) never moves.
func (c *Console) replay(w http.ResponseWriter, r *http.Request, s *session) {
	f := r.PostForm
	d := confirmData{Mode: f.Get("mode"), Queue: strings.TrimSpace(f.Get("queue"))}
	idStrs := f["id"]
	if one := f.Get("one"); one != "" {
		idStrs = []string{one}
	}
	for _, v := range idStrs {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			c.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("Invalid effect id %q; nothing was replayed.", v))
			return
		}
		d.IDs = append(d.IDs, id)
	}
	switch d.Mode {
	case "ids":
		if len(d.IDs) == 0 {
			c.refuse(w, r, http.StatusBadRequest, "No dead letter selected; nothing was replayed.")
			return
		}
		d.Queue = ""
	case "queue":
		// The confirmation of a queue names the dead letters it showed.
		if d.Queue == "" || (len(d.IDs) > 0) != (f.Get("confirm") != "") {
			c.refuse(w, r, http.StatusBadRequest, "Replaying a queue needs its name, and its confirmation the ids shown (reload it); nothing was replayed.")
			return
		}
	default:
		c.refuse(w, r, http.StatusBadRequest, `mode must be "ids" or "queue"; nothing was replayed.`)
		return
	}
	target := "ids " + joinIDs(d.IDs)
	if d.Mode == "queue" {
		target = "queue " + d.Queue + " (the dead letters shown: " + target + ")"
	}
	ctx := r.Context()
	confirm := f.Get("confirm")
	if confirm == "" {
		// Step one: count, change nothing.
		res, err := ops.ReplayDeadLetters(ctx, c.cfg.Pool, ops.ReplayOptions{Filter: ops.Filter{Queue: d.Queue}, IDs: d.IDs,
			Limit: replayCap(d), DryRun: true})
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Count, d.Skipped = int64(len(res.Replayed)), res.Skipped
		for _, m := range res.Replayed {
			d.Move = append(d.Move, m.ID)
		}
		if d.Moving, err = store.EffectsByID(ctx, c.cfg.Pool, d.Move[:min(len(d.Move), PageSizeDefault)]); err != nil {
			c.fail(w, r, err)
			return
		}
		if d.More = len(d.Move) - len(d.Moving); len(d.Move) > 0 {
			d.Last = slices.Max(d.Move)
		}
		if d.Mode == "queue" {
			if d.QueueTotal, err = store.CountDeadLetters(ctx, c.cfg.Pool, store.OpsFilter{Queue: d.Queue}); err != nil {
				c.fail(w, r, err)
				return
			}
		}
		c.render(w, r, http.StatusOK, "confirm", "Confirm replay", d)
		return
	}
	n, err := strconv.ParseInt(confirm, 10, 64)
	if err != nil || n <= 0 || n > 1_000_000 {
		c.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("Invalid confirmed count %q; nothing was replayed.", confirm))
		return
	}
	op, sess := who(s)
	res, err := ops.ReplayDeadLetters(ctx, c.cfg.Pool, ops.ReplayOptions{Filter: ops.Filter{Queue: d.Queue}, IDs: d.IDs,
		Limit: int(n), By: op, Then: func(ctx context.Context, tx pgx.Tx, res *ops.ReplayResult) error {
			outcome := fmt.Sprintf("replayed %d of %d confirmed", len(res.Replayed), n)
			if len(res.Skipped) > 0 {
				outcome += fmt.Sprintf("; skipped %d", len(res.Skipped))
				for _, sk := range res.Skipped {
					outcome += fmt.Sprintf(" (%d: %s)", sk.ID, sk.State)
				}
			}
			return store.InsertAudit(ctx, tx, store.AuditEntry{Operator: op, Session: sess, Action: "replay",
				Target: short(target, 1000), Changed: len(res.Replayed), Outcome: short(outcome, 2000)})
		}})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.Info("console action", "operator", op, "session", sess, "action", "replay", "target", target,
		"changed", len(res.Replayed))
	d.Count, d.Result, d.Skipped = n, res, res.Skipped
	c.render(w, r, http.StatusOK, "replayed", "Replayed", d)
}

// replayCap is the dry run's limit: every requested id, or the default
// batch for a queue (whose count is taken separately).
func replayCap(d confirmData) int {
	if len(d.IDs) > 0 {
		return len(d.IDs)
	}
	return ops.ReplayBatchLimitDefault
}

func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ",")
}

// resolve closes a reconciliation record with a workflow run, by the
// CLI's rules: checked against GitHub, or unverified only with force.
func (c *Console) resolve(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := pathID(r)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if c.cfg.ControlPlane == nil {
		c.refuse(w, r, http.StatusServiceUnavailable, "The control plane is not configured in this server: use `pgoutbox reconcile`.")
		return
	}
	runID, err := strconv.ParseInt(strings.TrimSpace(r.PostForm.Get("workflow_run_id")), 10, 64)
	if err != nil || runID <= 0 {
		c.refuse(w, r, http.StatusBadRequest, "The workflow run id must be a positive number; nothing was changed.")
		return
	}
	force := r.PostForm.Get("force") == "1"
	target := fmt.Sprintf("effect %d workflow run %d", id, runID)
	if force {
		err = c.cfg.ControlPlane.ResolveUnverified(r.Context(), id, runID)
	} else {
		err = c.cfg.ControlPlane.Resolve(r.Context(), id, runID)
	}
	if err != nil {
		c.audit(r.Context(), s, "resolve", target, 0, "refused: "+err.Error())
		status := http.StatusConflict
		if errors.Is(err, controlplane.ErrNoGitHub) {
			err = errors.New(err.Error() + "; tick \"force\" to resolve without the check")
		}
		c.render(w, r, status, "message", "Resolve refused", message{Text: "Refused, nothing changed: " + err.Error(),
			Error: true, Back: fmt.Sprintf("/console/effects/%d", id)})
		return
	}
	how := "checked against GitHub"
	if force {
		how = "not checked: forced"
	}
	c.audit(r.Context(), s, "resolve", target, 1, "resolved ("+how+")")
	c.render(w, r, http.StatusOK, "message", "Resolved", message{
		Text: fmt.Sprintf("Resolved %d: workflow run %d recorded (%s), record completed.", id, runID, how),
		Back: fmt.Sprintf("/console/effects/%d", id)})
}

// supersede closes a reconciliation record whose dispatch did not happen
// and dispatches a new attempt.
func (c *Console) supersede(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := pathID(r)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if c.cfg.ControlPlane == nil {
		c.refuse(w, r, http.StatusServiceUnavailable, "The control plane is not configured in this server: use `pgoutbox reconcile`.")
		return
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if reason == "" {
		c.refuse(w, r, http.StatusBadRequest, "A reason is required; nothing was changed.")
		return
	}
	target := fmt.Sprintf("effect %d", id)
	st, err := c.cfg.ControlPlane.Supersede(r.Context(), id, short(reason, 500))
	if err != nil {
		c.audit(r.Context(), s, "supersede", target, 0, "refused: "+err.Error())
		c.render(w, r, http.StatusConflict, "message", "Supersede refused", message{Text: "Refused, nothing changed: " + err.Error(),
			Error: true, Back: fmt.Sprintf("/console/effects/%d", id)})
		return
	}
	c.audit(r.Context(), s, "supersede", target, 1, fmt.Sprintf("superseded (reason: %s); release run %d attempt %d (number %d) dispatched",
		short(reason, 500), st.ReleaseRunID, st.ExecutionAttemptID, st.AttemptNumber))
	c.render(w, r, http.StatusOK, "message", "Superseded", message{
		Text: fmt.Sprintf("Superseded %d: release run %d attempt %d (number %d) dispatched.", id, st.ReleaseRunID,
			st.ExecutionAttemptID, st.AttemptNumber),
		Back: fmt.Sprintf("/console/effects/%d", id)})
}

// status is an effect's state in words: the state, and what it waits for.
type status struct {
	State string // the state column, or "cancelled"
	Note  string // "scheduled, due …", "retrying, due …", "waiting behind its key's head", "8/8 attempts"
	Class string // "warn" for a wait an operator may need to act on
}

// rowStatus says what an available effect waits for (its due time, a
// retry, the head of its ordering key): a delayed or blocked effect must
// not read as plain available.
func rowStatus(e store.EffectRow) status {
	now := time.Now()
	s := status{State: e.State}
	switch e.State {
	case "available":
		switch {
		case e.Waiting:
			s.Note, s.Class = "waiting behind its ordering key's head", "warn"
		case e.DueAt.After(now) && e.Attempts > 0:
			s.Note = fmt.Sprintf("retrying, attempt %d of %d due %s", e.Attempts+1, e.MaxAttempts, e.DueAt.UTC().Format("15:04:05 UTC"))
		case e.DueAt.After(now):
			s.Note = "scheduled, due " + e.DueAt.UTC().Format("2006-01-02 15:04:05 UTC")
		case e.Attempts > 0:
			s.Note = fmt.Sprintf("retry due now (attempt %d of %d)", e.Attempts+1, e.MaxAttempts)
		}
	case "dead_letter":
		if e.Attempts >= e.MaxAttempts {
			s.Note = fmt.Sprintf("out of attempts (%d/%d)", e.Attempts, e.MaxAttempts)
		} else {
			s.Note = fmt.Sprintf("permanent failure at attempt %d", e.Attempts)
		}
	case "completed":
		if e.Cancelled {
			s.State, s.Note = "cancelled", "completed without delivery"
		}
	}
	return s
}

// ago says how long before now t was, rounded ("3m12s").
func ago(t any) string {
	var at time.Time
	switch v := t.(type) {
	case time.Time:
		at = v
	case *time.Time:
		if v == nil {
			return "-"
		}
		at = *v
	}
	d := time.Since(at).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}
