package projection

import (
	"net/http"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// CronResponse answers GET /api/cron/outbox.
type CronResponse struct {
	// Status is "disabled" (nothing claimed; Reason says why) or "ran".
	Status string `json:"status"`
	// Reason explains a "disabled" answer.
	Reason string `json:"reason,omitempty"`
	// Limit is the cycle's bound (METAMUSEUM_OUTBOX_CRON_LIMIT).
	Limit int `json:"limit"`
	// Targets are the enabled targets.
	Targets []string `json:"targets"`
	// Summary is what the cycle did (zero when disabled).
	Summary
	// DurationMS is how long the cycle took.
	DurationMS int64 `json:"duration_ms"`
}

// cronDisabledReason says why the cron endpoint would not run, or "".
func (a *App) cronDisabledReason() string {
	switch {
	case !a.cfg.CronEnabled:
		return "METAMUSEUM_OUTBOX_CRON_ENABLED is not 1"
	case !a.Enabled():
		return "no projection target is enabled (" + a.disabledTargets() + ")"
	}
	return ""
}

func (a *App) disabledTargets() string {
	var parts []string
	for _, name := range []string{TargetSolr, TargetGraphDB} {
		if why, ok := a.cfg.Disabled[name]; ok && !a.targetOn(name) {
			parts = append(parts, name+": "+why)
		}
	}
	return strings.Join(parts, "; ")
}

func (a *App) targetOn(name string) bool {
	for _, t := range a.targets {
		if t.Name() == name {
			return true
		}
	}
	return false
}

// cron runs one bounded projection cycle for a platform scheduler (every 5
// minutes). Routes wraps it in requireCronSecret, which runs before
// anything else. It claims nothing unless METAMUSEUM_OUTBOX_CRON_ENABLED=1
// and a target is on, so it is safe to deploy while disabled.
func (a *App) cron(w http.ResponseWriter, r *http.Request) {
	resp := CronResponse{Limit: a.cfg.CronLimit, Targets: a.Targets()}
	if why := a.cronDisabledReason(); why != "" {
		resp.Status, resp.Reason = "disabled", why
		httpx.WriteJSON(w, http.StatusOK, resp)
		return
	}
	start := time.Now()
	s, err := a.RunBatch(r.Context(), a.cfg.CronLimit)
	if err == nil {
		s.Remaining, s.RemainingReady, err = a.Remaining(r.Context())
	}
	if err != nil {
		a.cfg.Logger.Error("cron cycle failed", "err", err)
		httpx.Error(w, http.StatusInternalServerError, "the projection cycle failed")
		return
	}
	resp.Status, resp.Summary, resp.DurationMS = "ran", s, time.Since(start).Milliseconds()
	httpx.WriteJSON(w, http.StatusOK, resp)
}
