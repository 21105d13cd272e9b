package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
)

// PublishTypeName is the effect type that publishes a message to JetStream.
const PublishTypeName = "nats.publish"

// PublishPayload is the payload of a nats.publish effect.
type PublishPayload struct {
	// Subject is the subject to publish to; a JetStream stream must bind it.
	Subject string `json:"subject"`
	// Data is the message body, published verbatim (JSON).
	Data json.RawMessage `json:"data,omitempty"`
	// Headers are extra message headers. Nats-Msg-Id is always the effect's
	// idempotency key and cannot be set here.
	Headers map[string]string `json:"headers,omitempty"`
}

// PublishEffect builds a nats.publish effect for queue: data (marshalled
// with encoding/json) published to subject with Nats-Msg-Id = key. Build key
// with pgoutbox.Key from what makes the message unique.
func PublishEffect(queue, subject string, data any, key string) (pgoutbox.Effect, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return pgoutbox.Effect{}, fmt.Errorf("nats: publish effect data: %w", err)
	}
	return pgoutbox.Effect{
		Queue: queue, Type: PublishTypeName, Key: key,
		Payload: PublishPayload{Subject: subject, Data: raw},
	}, nil
}

// PublishType registers nats.publish: replay-safe, delivered by Publish on
// js.
func PublishType(js jetstream.JetStream) pgoutbox.EffectType {
	return pgoutbox.EffectType{
		Name:       PublishTypeName,
		ReplaySafe: true,
		Handler:    func(ctx context.Context, d *pgoutbox.Delivery) error { return Publish(ctx, js, d) },
	}
}

// Publish delivers one nats.publish effect: it publishes the payload's data
// to its subject with Nats-Msg-Id = the effect's idempotency key and waits
// for the JetStream publish ack. The ack completes the effect; a duplicate ack
// (the stream already holds the message, from an earlier attempt) is
// success too. A malformed payload or a message over the server's maximum
// payload is permanent; no stream answering, a stream refusing the message
// and a missing ack are retried (the message id makes a resend harmless).
func Publish(ctx context.Context, js jetstream.JetStream, d *pgoutbox.Delivery) error {
	var p PublishPayload
	if err := json.Unmarshal(d.Payload, &p); err != nil {
		return pgoutbox.Permanent(fmt.Errorf("nats.publish payload: %w", err))
	}
	if p.Subject == "" || strings.ContainsAny(p.Subject, "*> \t\r\n") {
		return pgoutbox.Permanent(fmt.Errorf("nats.publish payload: subject %q is not a publishable subject", p.Subject))
	}
	msg := natsgo.NewMsg(p.Subject)
	msg.Data = p.Data
	for k, v := range p.Headers {
		if strings.EqualFold(k, jetstream.MsgIDHeader) {
			continue
		}
		msg.Header.Set(k, v)
	}
	msg.Header.Set(jetstream.MsgIDHeader, d.Key)
	_, err := js.PublishMsg(ctx, msg)
	if err == nil {
		return nil
	}
	return classifyPublish(err)
}

// classifyPublish maps a publish error to a delivery outcome.
func classifyPublish(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, natsgo.ErrMaxPayload), errors.Is(err, natsgo.ErrBadSubject):
		return pgoutbox.Permanent(err)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, natsgo.ErrNoResponders):
		return pgoutbox.Retry(fmt.Errorf("no JetStream stream answered: %w", err))
	case errors.As(err, &apiErr):
		return pgoutbox.Retry(err) // the stream refused the message: nothing was stored
	default:
		// A timeout or a lost connection after sending: the stream may hold
		// the message. Ambiguous is a retry for this replay-safe type, and
		// the message id makes the resend a duplicate.
		return pgoutbox.Ambiguous(err)
	}
}
