package controlplane

import (
	"errors"
	"fmt"
	"path"
)

// Defaults (docs/design.md, "The release control plane").
const (
	// MaxBodyBytesDefault is GitHub's webhook payload cap, 25 MiB
	// (WEBHOOK_MAX_BODY_BYTES).
	MaxBodyBytesDefault = 25 << 20
	// TagPatternDefault selects release tags (RELEASE_TAG_PATTERN).
	TagPatternDefault = "refs/tags/v*"
	// WorkflowDefault is the dispatched workflow file (RELEASE_WORKFLOW).
	WorkflowDefault = "release.yml"
	// CheckRunNameDefault names our Check Runs (CHECK_RUN_NAME).
	CheckRunNameDefault = "BoardReadyOps release"
	// MaxAttemptsDefault bounds GitHub effect attempts (OUTBOX_MAX_ATTEMPTS).
	MaxAttemptsDefault = 8
)

// Queues and effect types of the control plane.
const (
	QueueJobs   = "control_plane_jobs"
	QueueOutbox = "control_plane_outbox"

	TypeWebhook          = "control_plane.webhook"
	TypeCheckRunCreate   = "github.check_run.create"
	TypeWorkflowDispatch = "github.workflow.dispatch"
	TypeCheckRunComplete = "github.check_run.complete"
)

// Config configures the control plane.
type Config struct {
	// WebhookSecret verifies X-Hub-Signature-256 (GITHUB_WEBHOOK_SECRET).
	// Required: the control plane refuses to start without it.
	WebhookSecret []byte
	// MaxBodyBytes default MaxBodyBytesDefault.
	MaxBodyBytes int64
	// TagPattern default TagPatternDefault; a path.Match pattern on the ref.
	TagPattern string
	// Workflow default WorkflowDefault.
	Workflow string
	// CheckRunName default CheckRunNameDefault.
	CheckRunName string
	// APIToken guards POST /api/release-runs (PGOUTBOX_API_TOKEN); empty
	// answers 503 "not configured".
	APIToken string
	// MaxAttempts default MaxAttemptsDefault.
	MaxAttempts int
}

// ErrNoWebhookSecret is returned by New when GITHUB_WEBHOOK_SECRET is empty.
var ErrNoWebhookSecret = errors.New("controlplane: GITHUB_WEBHOOK_SECRET is empty; refusing to accept unsigned webhooks")

func (c Config) withDefaults(needSecret bool) (Config, error) {
	if needSecret && len(c.WebhookSecret) == 0 {
		return c, ErrNoWebhookSecret
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = MaxBodyBytesDefault
	}
	if c.TagPattern == "" {
		c.TagPattern = TagPatternDefault
	}
	if _, err := path.Match(c.TagPattern, "refs/tags/v1"); err != nil {
		return c, fmt.Errorf("controlplane: RELEASE_TAG_PATTERN %q: %w", c.TagPattern, err)
	}
	if c.Workflow == "" {
		c.Workflow = WorkflowDefault
	}
	if c.CheckRunName == "" {
		c.CheckRunName = CheckRunNameDefault
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
	return c, nil
}
