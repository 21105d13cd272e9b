package controlplane

import (
	"errors"
	"fmt"
	"path"
	"time"
)

// Defaults (docs/controlplane.md).
const (
	// MaxBodyBytesDefault is GitHub's webhook payload cap, 25 MiB
	// (WEBHOOK_MAX_BODY_BYTES).
	MaxBodyBytesDefault = 25 << 20
	// MaxBufferedBytesDefault bounds the webhook bodies held in memory
	// together, 64 MiB (WEBHOOK_MAX_BUFFERED_BYTES); when twice
	// MaxBodyBytes is more, that is the default.
	MaxBufferedBytesDefault = 64 << 20
	// BodyReadTimeout bounds how long a webhook body may take to arrive:
	// GitHub gives up on a delivery after 10 s, so a slower body is not
	// GitHub's, and it holds the buffer budget no longer.
	BodyReadTimeout = 10 * time.Second
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
	// MaxBufferedBytes bounds the bytes of the webhook bodies being read
	// or held (from before their signature is checked until they are
	// answered) together; a body that does not fit is answered 503 with
	// Retry-After. Default MaxBufferedBytesDefault or 2 × MaxBodyBytes,
	// whichever is more; less than MaxBodyBytes is refused.
	MaxBufferedBytes int64
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
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = max(MaxBufferedBytesDefault, 2*c.MaxBodyBytes)
	}
	if c.MaxBufferedBytes < c.MaxBodyBytes {
		return c, fmt.Errorf("controlplane: WEBHOOK_MAX_BUFFERED_BYTES (%d) is below WEBHOOK_MAX_BODY_BYTES (%d): no body of the limit could be read",
			c.MaxBufferedBytes, c.MaxBodyBytes)
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
