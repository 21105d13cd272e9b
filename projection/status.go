package projection

import (
	"context"
	"fmt"
	"time"
)

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

// Status is the projection's own state, as an operator's page shows it
// (the console's /workers): its records, targets and cron drain. The
// queue's numbers are the engine's (`pgoutbox status`).
type Status struct {
	// Records counts the stored records.
	Records int64 `json:"records"`
	// Targets lists solr and graphdb, on or off (and why).
	Targets []TargetStatus `json:"targets"`
	// Cron describes the cron drain.
	Cron CronStatus `json:"cron"`
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

// Status reads the projection's state at now.
func (a *App) Status(ctx context.Context, now time.Time) (Status, error) {
	var st Status
	var err error
	if st.Records, err = CountRecords(ctx, a.pool); err != nil {
		return st, err
	}
	for _, name := range []string{TargetSolr, TargetGraphDB} {
		ts := TargetStatus{Name: name, Enabled: a.targetOn(name)}
		if !ts.Enabled {
			ts.Reason = a.cfg.Disabled[name]
		}
		st.Targets = append(st.Targets, ts)
	}
	st.Cron = CronStatus{
		Enabled:         a.cronDisabledReason() == "",
		Reason:          a.cronDisabledReason(),
		ScheduleSeconds: int64(a.cfg.CronSchedule / time.Second),
		NextWakeUp:      NextWakeUp(now, a.cfg.CronSchedule),
		Limit:           a.cfg.CronLimit,
		SecretSet:       a.cfg.CronSecret != "",
	}
	return st, nil
}

// NextDrain says when, after now, the backlog of Queue is next worked and
// by what: by workers (workers names them, e.g. "the workers of this
// server"; "" when no worker serves Queue), else by the cron endpoint, else
// only by hand (At is nil).
func (a *App) NextDrain(now time.Time, workers string) NextDrain {
	cron := a.cronDisabledReason()
	switch {
	case !a.Enabled():
		return NextDrain{By: "nothing", Why: "no projection target is enabled: records wait in the queue"}
	case workers != "":
		return NextDrain{At: &now, By: workers + " (continuous)"}
	case cron == "" && a.cfg.CronSecret != "":
		at := NextWakeUp(now, a.cfg.CronSchedule)
		return NextDrain{At: &at, By: fmt.Sprintf("the cron endpoint (up to %d effects)", a.cfg.CronLimit)}
	}
	if cron == "" {
		cron = "CRON_SECRET is not set"
	}
	return NextDrain{By: "`pgoutbox projector drain` run by hand", Why: "the cron drain is off: " + cron}
}

// NextWakeUp is the next multiple of period after now (UTC, aligned to the
// Unix epoch, which for divisors of an hour is "*/N * * * *").
func NextWakeUp(now time.Time, period time.Duration) time.Time {
	if period <= 0 {
		period = CronScheduleDefault
	}
	return now.UTC().Truncate(period).Add(period)
}
