package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// The console's pause, resume and cancel follow replay's rules: a POST
// from the console's own origin, with a live session and its CSRF token;
// a first POST shows what would change and asks; the confirming POST acts
// and records its audit row in the action's transaction.

// blockedData is the data of the blocked-keys page.
type blockedData struct {
	Queue string
	Res   *ops.BlockedResult
	Limit int
}

// blockedKeysPage lists the ordering keys held back by their head, and why,
// with the head's error and a link to it (and its replay or cancel).
func (c *Console) blockedKeysPage(w http.ResponseWriter, r *http.Request) {
	limit, err := pageSize(r)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	q := r.URL.Query().Get("queue")
	res, err := ops.BlockedKeys(r.Context(), c.cfg.Pool, ops.BlockedOptions{Queue: q, Limit: limit})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "blocked", "Blocked keys", blockedData{Queue: q, Res: res, Limit: limit})
}

// workersData is the data of the workers page.
type workersData struct {
	Workers  []ops.Worker
	Unserved []ops.UnservedQueue
	Paused   []ops.QueuePause
}

// workersPage lists the live worker processes (pgoutbox.workers) and the
// queues that hold effects no live worker works.
func (c *Console) workersPage(w http.ResponseWriter, r *http.Request) {
	ws, err := ops.LiveWorkers(r.Context(), c.cfg.Pool)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	un, err := ops.UnservedQueues(r.Context(), c.cfg.Pool)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	ps, err := ops.PausedQueues(r.Context(), c.cfg.Pool)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "workers", "Workers", workersData{Workers: ws, Unserved: un, Paused: ps})
}

// pauseData is the data of the pause and resume confirmation pages.
type pauseData struct {
	Resume bool
	Queue  string
	Counts ops.Counts
	Pause  *ops.QueuePause
	Reason string
}

// pauseQueue and resumeQueue pause and resume a queue in two steps.
func (c *Console) pauseQueue(w http.ResponseWriter, r *http.Request, s *session) {
	c.pauseOrResume(w, r, s, false)
}

func (c *Console) resumeQueue(w http.ResponseWriter, r *http.Request, s *session) {
	c.pauseOrResume(w, r, s, true)
}

func (c *Console) pauseOrResume(w http.ResponseWriter, r *http.Request, s *session, resume bool) {
	verb, action := "pause", "pause"
	if resume {
		verb, action = "resume", "resume"
	}
	d := pauseData{Resume: resume, Queue: strings.TrimSpace(r.PostForm.Get("queue")), Reason: strings.TrimSpace(r.PostForm.Get("reason"))}
	op, sess := who(s)
	o := ops.PauseOptions{Queue: d.Queue, By: op, Reason: d.Reason}
	if err := o.Check(!resume); err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error()+"; nothing was changed.")
		return
	}
	ctx := r.Context()
	if r.PostForm.Get("confirm") != "1" {
		st, err := ops.Status(ctx, c.cfg.Pool, ops.StatusOptions{Filter: ops.Filter{Queue: d.Queue}})
		if err != nil {
			c.fail(w, r, err)
			return
		}
		if len(st.Queues) == 1 {
			d.Counts = st.Queues[0]
		}
		d.Pause = st.PausedQueue(d.Queue)
		title := "Confirm pause"
		if resume {
			title = "Confirm resume"
		}
		c.render(w, r, http.StatusOK, "pauseconfirm", title, d)
		return
	}
	target := "queue " + d.Queue
	audit := func(ctx context.Context, tx pgx.Tx, p ops.QueuePause, changed bool) error {
		outcome := map[[2]bool]string{
			{false, true}: "paused", {false, false}: "already paused: nothing changed",
			{true, true}: "resumed", {true, false}: "not paused: nothing changed",
		}[[2]bool{resume, changed}]
		if d.Reason != "" && !resume {
			outcome += " (reason: " + d.Reason + ")"
		}
		n := 0
		if changed {
			n = 1
		}
		return store.InsertAudit(ctx, tx, store.AuditEntry{Operator: op, Session: sess, Action: action,
			Target: short(target, 1000), Changed: n, Outcome: short(outcome, 2000)})
	}
	o.Then = audit
	var text string
	var err error
	if resume {
		var was bool
		_, was, err = ops.ResumeQueue(ctx, c.cfg.Pool, o)
		text = fmt.Sprintf("Resumed queue %s: its workers claim its effects again.", d.Queue)
		if err == nil && !was {
			text = fmt.Sprintf("Queue %s was not paused; nothing changed.", d.Queue)
		}
	} else {
		var p ops.QueuePause
		p, err = ops.PauseQueue(ctx, c.cfg.Pool, o)
		text = fmt.Sprintf("Paused queue %s: no claim takes its effects until it is resumed; enqueues go on.", d.Queue)
		if err == nil && p.Already {
			text = fmt.Sprintf("Queue %s was already paused (by %s); nothing changed.", d.Queue, p.By)
		}
	}
	if errors.Is(err, ops.ErrBadInput) {
		c.refuse(w, r, http.StatusBadRequest, err.Error()+"; nothing was changed.")
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.Info("console action", "operator", op, "session", sess, "action", verb, "target", target)
	c.render(w, r, http.StatusOK, "message", "Queue "+d.Queue, message{Text: text, Back: "/console/"})
}

// cancelData is the data of the cancel confirmation and result pages.
type cancelData struct {
	IDs    []int64
	Reason string
	// Move is every id the confirmation will cancel, Moving those rows.
	Move    []int64
	Moving  []store.EffectRow
	Skipped []ops.Skipped
	Result  *ops.CancelResult
	// Back is where the confirmation's "Back" returns (the list it came
	// from, with its filter).
	Back string
}

// cancel discards effects in two steps, as replay: the first POST lists
// what would be cancelled and what is refused, and asks (with an optional
// reason); the confirming POST (confirm=N) cancels at most those ids that
// may still be cancelled and records the audit row in its transaction.
func (c *Console) cancel(w http.ResponseWriter, r *http.Request, s *session) {
	f := r.PostForm
	d := cancelData{Reason: strings.TrimSpace(f.Get("reason")), Back: safeBack(f.Get("back"))}
	for _, v := range f["id"] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			c.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("Invalid effect id %q; nothing was cancelled.", v))
			return
		}
		d.IDs = append(d.IDs, id)
	}
	ctx := r.Context()
	op, sess := who(s)
	if err := (ops.CancelOptions{IDs: d.IDs, By: op, Reason: d.Reason}).Check(); err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error()+"; nothing was cancelled.")
		return
	}
	confirm := f.Get("confirm")
	if confirm == "" {
		res, err := ops.CancelEffects(ctx, c.cfg.Pool, ops.CancelOptions{IDs: d.IDs, By: op, Reason: d.Reason, DryRun: true})
		if err != nil {
			c.fail(w, r, err)
			return
		}
		for _, m := range res.Cancelled {
			d.Move = append(d.Move, m.ID)
		}
		d.Skipped = res.Skipped
		if d.Moving, err = store.EffectsByID(ctx, c.cfg.Pool, d.Move); err != nil {
			c.fail(w, r, err)
			return
		}
		c.render(w, r, http.StatusOK, "cancelconfirm", "Confirm cancel", d)
		return
	}
	n, err := strconv.Atoi(confirm)
	if err != nil || n <= 0 || n != len(d.IDs) {
		c.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("Invalid confirmed count %q; nothing was cancelled.", confirm))
		return
	}
	target := "ids " + joinIDs(d.IDs)
	res, err := ops.CancelEffects(ctx, c.cfg.Pool, ops.CancelOptions{IDs: d.IDs, By: op, Reason: d.Reason,
		Then: func(ctx context.Context, tx pgx.Tx, res *ops.CancelResult) error {
			outcome := fmt.Sprintf("cancelled %d of %d confirmed", len(res.Cancelled), n)
			if d.Reason != "" {
				outcome += " (reason: " + d.Reason + ")"
			}
			for _, sk := range res.Skipped {
				outcome += fmt.Sprintf("; not %d (%s)", sk.ID, sk.State)
			}
			return store.InsertAudit(ctx, tx, store.AuditEntry{Operator: op, Session: sess, Action: "cancel",
				Target: short(target, 1000), Changed: len(res.Cancelled), Outcome: short(outcome, 2000)})
		}})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.Info("console action", "operator", op, "session", sess, "action", "cancel", "target", target,
		"changed", len(res.Cancelled))
	d.Result, d.Skipped = res, res.Skipped
	c.render(w, r, http.StatusOK, "cancelled", "Cancelled", d)
}

// safeBack keeps a "back" link only when it is one of the console's own
// paths (never another origin).
func safeBack(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "" || u.Host != "" || !strings.HasPrefix(u.Path, Prefix) || strings.HasPrefix(s, "//") {
		return ""
	}
	return u.String()
}
