package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Alert thresholds (docs/operations.md). A rule fires when its value
// reaches its threshold (value >= threshold); a threshold ≤ 0 disables the
// rule, except reconciliation_required and stalled_leases, which always fire
// on any record or any lease held past the stalled age
// (OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES, StatusOptions.StalledAfter).
const (
	// DeadLetterThresholdDefault: OUTBOX_DLQ_ALERT_THRESHOLD.
	DeadLetterThresholdDefault = 1
	// RetryingThresholdDefault: OUTBOX_RETRY_ALERT_THRESHOLD.
	RetryingThresholdDefault = 50
	// PendingThresholdDefault: OUTBOX_PENDING_ALERT_THRESHOLD.
	PendingThresholdDefault = 200
	// PendingMaxAgeDefault: OUTBOX_PENDING_MAX_AGE_MINUTES (15).
	PendingMaxAgeDefault = 15 * time.Minute
	// XminMaxAgeDefault: OUTBOX_XMIN_MAX_AGE_MINUTES (5). A transaction
	// holding the xmin horizon longer keeps VACUUM from cleaning the effects
	// table, whose every transition leaves a dead tuple.
	XminMaxAgeDefault = 5 * time.Minute
	// WebhookTimeoutDefault bounds the POST to OUTBOX_ALERT_WEBHOOK_URL.
	WebhookTimeoutDefault = 10 * time.Second
)

// Rule names, as printed and posted.
const (
	RuleDeadLetters            = "dead_letters"
	RuleRetrying               = "retrying"
	RulePending                = "pending"
	RulePendingAge             = "pending_age"
	RuleReconciliationRequired = "reconciliation_required"
	RuleXminAge                = "xmin_age"
	RuleStalledLeases          = "stalled_leases"
)

// Thresholds are the alert rules' thresholds.
type Thresholds struct {
	// DeadLetters default DeadLetterThresholdDefault (1).
	DeadLetters int64
	// Retrying default RetryingThresholdDefault (50).
	Retrying int64
	// Pending default PendingThresholdDefault (200).
	Pending int64
	// PendingMaxAge default PendingMaxAgeDefault (15 min).
	PendingMaxAge time.Duration
	// XminMaxAge default XminMaxAgeDefault (5 min).
	XminMaxAge time.Duration
}

// DefaultThresholds returns the documented defaults.
func DefaultThresholds() Thresholds {
	return Thresholds{
		DeadLetters: DeadLetterThresholdDefault, Retrying: RetryingThresholdDefault,
		Pending: PendingThresholdDefault, PendingMaxAge: PendingMaxAgeDefault, XminMaxAge: XminMaxAgeDefault,
	}
}

// RuleResult is one evaluated rule.
type RuleResult struct {
	Rule        string  `json:"rule"`
	Description string  `json:"description"`
	Value       float64 `json:"value"`
	Threshold   float64 `json:"threshold"`
	// Unit is "effects", "records", "leases", "seconds" or "transactions".
	Unit     string `json:"unit"`
	Firing   bool   `json:"firing"`
	Disabled bool   `json:"disabled,omitempty"`
}

// AlertReport is the outcome of an alert check.
type AlertReport struct {
	CheckedAt time.Time    `json:"checked_at"`
	Filter    Filter       `json:"filter"`
	Firing    bool         `json:"firing"`
	Rules     []RuleResult `json:"rules"`
}

// FiringRules returns the rules that fire.
func (r *AlertReport) FiringRules() []RuleResult {
	var out []RuleResult
	for _, x := range r.Rules {
		if x.Firing {
			out = append(out, x)
		}
	}
	return out
}

// Evaluate applies the thresholds to a snapshot. Counts are summed over the
// snapshot's queues (one queue with --queue), ages take the maximum.
func Evaluate(s *Snapshot, t Thresholds) *AlertReport {
	tot := s.Total()
	rule := func(name, desc, unit string, value, threshold float64) RuleResult {
		r := RuleResult{Rule: name, Description: desc, Unit: unit, Value: value, Threshold: threshold}
		if threshold <= 0 {
			r.Disabled = true
			return r
		}
		r.Firing = value >= threshold
		return r
	}
	rep := &AlertReport{CheckedAt: s.TakenAt, Filter: s.Filter, Rules: []RuleResult{
		rule(RuleDeadLetters, "dead letters", "effects", float64(tot.DeadLetter), float64(t.DeadLetters)),
		rule(RuleRetrying, "available effects retrying after a failure", "effects", float64(tot.Retrying), float64(t.Retrying)),
		rule(RulePending, "available effects (pending)", "effects", float64(tot.Available), float64(t.Pending)),
		rule(RulePendingAge, "age of the oldest due available effect", "seconds", tot.OldestAvailableAgeSeconds, t.PendingMaxAge.Seconds()),
		rule(RuleReconciliationRequired, "records awaiting an operator's reconciliation", "records", float64(tot.ReconciliationRequired), 1),
		rule(RuleXminAge, "age of the oldest transaction holding back VACUUM (xmin horizon)", "seconds", s.OldestXminAgeSeconds, t.XminMaxAge.Seconds()),
		rule(RuleStalledLeases, fmt.Sprintf("leases held longer than %s (OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES)",
			time.Duration(s.StalledAfterSeconds*float64(time.Second))), "leases", float64(tot.StalledLeases), 1),
	}}
	for _, r := range rep.Rules {
		rep.Firing = rep.Firing || r.Firing
	}
	return rep
}

// WebhookAlert is the JSON body posted to OUTBOX_ALERT_WEBHOOK_URL.
type WebhookAlert struct {
	// Source is "pgoutbox".
	Source string `json:"source"`
	// Status is "firing".
	Status    string    `json:"status"`
	CheckedAt time.Time `json:"checked_at"`
	Filter    Filter    `json:"filter"`
	// Summary is one line naming the firing rules and their values.
	Summary string `json:"summary"`
	// Firing lists the rules that fire; Rules every evaluated rule.
	Firing []RuleResult `json:"firing"`
	Rules  []RuleResult `json:"rules"`
}

// PostAlert posts the report's firing rules as a WebhookAlert to rawURL,
// within timeout (≤ 0: WebhookTimeoutDefault). Any status other than 2xx is
// an error. Errors never contain the URL, which often embeds a secret
// token.
func PostAlert(ctx context.Context, client *http.Client, rawURL string, rep *AlertReport, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = WebhookTimeoutDefault
	}
	if client == nil {
		client = http.DefaultClient
	}
	body, err := json.Marshal(WebhookAlert{
		Source: "pgoutbox", Status: "firing", CheckedAt: rep.CheckedAt, Filter: rep.Filter,
		Summary: summary(rep), Firing: rep.FiringRules(), Rules: rep.Rules,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rawURL, bytes.NewReader(body))
	if err != nil {
		return errors.New("alert webhook: invalid OUTBOX_ALERT_WEBHOOK_URL")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "pgoutbox-alert")
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("alert webhook: no answer within %s", timeout)
		}
		return fmt.Errorf("alert webhook: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("alert webhook: answered %s", resp.Status)
	}
	return nil
}

func summary(rep *AlertReport) string {
	var b bytes.Buffer
	b.WriteString("pgoutbox alert:")
	for i, r := range rep.FiringRules() {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s %g >= %g %s", r.Rule, r.Value, r.Threshold, r.Unit)
	}
	return b.String()
}
