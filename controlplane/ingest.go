package controlplane

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// IngestResult is the JSON answer of POST /webhooks/github.
type IngestResult struct {
	DeliveryID string `json:"delivery_id"`
	InboxID    int64  `json:"inbox_id,omitempty"`
	JobID      int64  `json:"job_id,omitempty"`
	Duplicate  bool   `json:"duplicate,omitempty"`
	// Replayed says that the body is already in the inbox under another
	// delivery id: a captured delivery posted again. Nothing was written.
	Replayed bool `json:"replayed,omitempty"`
}

// ingest accepts a GitHub webhook: it never calls GitHub and writes the inbox
// row and one lifecycle job in one transaction, or nothing.
func (a *App) ingest(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		httpx.Error(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json (set the webhook's content type to JSON)")
		return
	}
	event, delivery := r.Header.Get(webhook.EventHeader), r.Header.Get(webhook.DeliveryHeader)
	if !headerValue(event) || !headerValue(delivery) {
		httpx.Error(w, http.StatusBadRequest, "X-GitHub-Event and X-GitHub-Delivery are required (1-128 printable characters)")
		return
	}
	// A request without a well-formed signature header is refused before
	// its body is read; the others' bodies are read under the buffer
	// budget, with the MAC computed as they arrive.
	v, err := webhook.NewVerifier(a.cfg.WebhookSecret, r.Header.Get(webhook.SignatureHeader))
	if err != nil {
		httpx.Error(w, http.StatusUnauthorized, "invalid or missing X-Hub-Signature-256")
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(BodyReadTimeout)) // unsupported in tests' recorders
	held, err := a.bodies.ReadBody(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes), v)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.Is(err, httpx.ErrBudgetSpent):
			a.log.Warn("webhook refused: the body buffer is full", "delivery", delivery, "event", event,
				"max_buffered_bytes", a.cfg.MaxBufferedBytes)
			httpx.RetryAfter(w, BodyReadTimeout)
			httpx.Error(w, http.StatusServiceUnavailable, "too many webhook bodies in flight; retry later")
		case errors.As(err, &mbe):
			httpx.Error(w, http.StatusRequestEntityTooLarge, "payload over the body limit")
		default:
			httpx.Error(w, http.StatusBadRequest, "could not read the body")
		}
		return
	}
	defer held.Release()
	if err := v.Verify(); err != nil {
		httpx.Error(w, http.StatusUnauthorized, "invalid or missing X-Hub-Signature-256")
		return
	}
	body := held.Bytes()
	n, err := webhook.Normalize(event, body)
	if err != nil {
		httpx.Error(w, http.StatusBadRequest, "malformed JSON payload")
		return
	}
	normalized, err := json.Marshal(n)
	if err != nil {
		httpx.Error(w, http.StatusInternalServerError, "could not encode the event")
		return
	}
	sum := sha256.Sum256(body)
	res := IngestResult{DeliveryID: delivery}
	err = pgx.BeginFunc(r.Context(), a.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(r.Context(), sqlInsertInbox, delivery, event, n.Action, n.InstallationID,
			// As text: in pgx's exec and simple-protocol modes (behind a
			// transaction pooler, docs/poolers.md) a []byte is sent as bytea.
			n.RepositoryID, hex.EncodeToString(sum[:]), string(normalized)).Scan(&res.InboxID)
		if errors.Is(err, pgx.ErrNoRows) {
			// Nothing written: a known delivery id, or a known body.
			if err := tx.QueryRow(r.Context(), sqlKnownDelivery, delivery).Scan(&res.Duplicate); err != nil {
				return err
			}
			res.Replayed = !res.Duplicate
			return nil
		}
		if err != nil {
			return err
		}
		res.JobID, err = pgoutbox.Enqueue(r.Context(), tx, pgoutbox.Effect{
			Queue: QueueJobs, Type: TypeWebhook, Key: pgoutbox.Key(TypeWebhook, delivery),
			Payload: webhookJob{InboxID: res.InboxID},
		})
		return err
	})
	if err != nil {
		a.log.Error("webhook not stored", "delivery", delivery, "event", event, "err", err)
		httpx.Error(w, http.StatusServiceUnavailable, "could not store the delivery; GitHub may redeliver it")
		return
	}
	if res.Duplicate {
		httpx.WriteJSON(w, http.StatusOK, res)
		return
	}
	if res.Replayed {
		// 202: the delivery is settled (GitHub, which never sends a known
		// body under a new id, is not asked to retry), and the answer's
		// "replayed" shows why in GitHub's delivery log.
		a.log.Warn("replayed webhook body refused: already in the inbox under another delivery id",
			"delivery", delivery, "event", event, "body_sha256", hex.EncodeToString(sum[:]))
		httpx.WriteJSON(w, http.StatusAccepted, res)
		return
	}
	httpx.WriteJSON(w, http.StatusAccepted, res)
}

// headerValue accepts an event name or delivery id: 1-128 printable ASCII
// characters (GitHub sends names and GUIDs).
func headerValue(v string) bool {
	if v == "" || len(v) > 128 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return false
		}
	}
	return true
}
