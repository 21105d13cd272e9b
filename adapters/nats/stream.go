package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
)

// Defaults of Stream and RetryPolicy.
const (
	// StreamNameDefault is the JetStream stream effects are relayed to
	// (NATS_STREAM).
	StreamNameDefault = "PGOUTBOX"
	// SubjectPrefixDefault starts every relayed subject:
	// <prefix>.<queue>.<effect_type> (NATS_SUBJECT_PREFIX).
	SubjectPrefixDefault = "pgoutbox"
	// AckWaitDefault is how long JetStream waits for a consumer's ack before
	// redelivering; it must be below the consumer's lease.
	AckWaitDefault = 30 * time.Second
)

// Headers every relayed message carries besides Nats-Msg-Id (the effect's
// idempotency key).
const (
	HeaderEffectID = "Pgoutbox-Effect-Id"
	HeaderQueue    = "Pgoutbox-Queue"
	HeaderType     = "Pgoutbox-Effect-Type"
)

// HeaderTraceparent is the W3C Trace Context header a relayed message
// carries when its effect's enqueue stored a traceparent: the effect's
// creation context, passed on unchanged (the package documentation,
// "Tracing").
const HeaderTraceparent = "traceparent"

// Stream names the JetStream stream of relayed effects. The relay creates it
// when it is missing and checks it when it exists; so does a consumer.
type Stream struct {
	// Name default StreamNameDefault ("PGOUTBOX").
	Name string
	// SubjectPrefix default SubjectPrefixDefault ("pgoutbox"); the stream
	// binds <prefix>.>.
	SubjectPrefix string
	// DuplicateWindow is the duplicate window of a stream created here;
	// default the retry horizon rounded up to a minute. It may not be
	// shorter than the retry horizon.
	DuplicateWindow time.Duration
	// Replicas of a stream created here; default 1.
	Replicas int
	// Memory stores a stream created here in memory instead of files
	// (tests and benchmarks only: a server restart loses it).
	Memory bool
}

func (s Stream) withDefaults() Stream {
	if s.Name == "" {
		s.Name = StreamNameDefault
	}
	if s.SubjectPrefix == "" {
		s.SubjectPrefix = SubjectPrefixDefault
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	return s
}

// Subject is the subject an effect of queue and type is relayed to.
func (s Stream) Subject(queue, effectType string) string {
	return s.withDefaults().SubjectPrefix + "." + queue + "." + effectType
}

// queueFilter is the filter subject of a queue's consumer.
func (s Stream) queueFilter(queue string) string {
	return s.SubjectPrefix + "." + queue + ".>"
}

// RetryPolicy is the retry policy of relayed effects; its Horizon is
// what the stream's duplicate window must cover. Relay and consumers must be
// given the same policy.
type RetryPolicy struct {
	// MaxAttempts is the largest max_attempts of relayed effects; default
	// pgoutbox.MaxAttemptsDefault (8).
	MaxAttempts int
	// BackoffCap default pgoutbox.BackoffCapDefault (300 s).
	BackoffCap time.Duration
	// LeaseDuration is a consumer's lease on an effect it delivers; default
	// pgoutbox.LeaseDurationDefault (60 s).
	LeaseDuration time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = pgoutbox.MaxAttemptsDefault
	}
	if p.BackoffCap == 0 {
		p.BackoffCap = pgoutbox.BackoffCapDefault
	}
	if p.LeaseDuration == 0 {
		p.LeaseDuration = pgoutbox.LeaseDurationDefault
	}
	return p
}

// Horizon is the longest time a relayed effect may keep being delivered:
// MaxAttempts attempts, each taking at most LeaseDuration (a crashed
// consumer's effect is taken over when its lease expires) and followed by
// the largest backoff (2^attempt s capped at BackoffCap, +10 % jitter), plus
// one more LeaseDuration for the last redelivery. It is also the lease under
// which a relay hands an effect over to JetStream.
func (p RetryPolicy) Horizon() time.Duration {
	p = p.withDefaults()
	return handoff.RetryHorizon(p.MaxAttempts, p.BackoffCap, p.LeaseDuration)
}

// ErrDuplicateWindow is matched (errors.Is) by the error of a relay or
// consumer that refused to start because the stream's duplicate window is
// shorter than the retry horizon.
var ErrDuplicateWindow = errors.New("nats: stream duplicate window shorter than the retry horizon")

// ErrStreamConfig is matched (errors.Is) by the error of a relay or consumer
// that refused to start because the existing stream cannot carry relayed
// effects (retention or subjects).
var ErrStreamConfig = errors.New("nats: stream unusable for relayed effects")

// EnsureStream creates the stream of relayed effects when it is missing (work
// queue retention, subjects <prefix>.>, duplicate window
// Stream.DuplicateWindow) and checks it when it exists. It refuses, saying
// why, a stream whose duplicate window is shorter than policy's retry
// horizon, whose retention is not work-queue, or which does not bind the
// queues' subjects.
func EnsureStream(ctx context.Context, js jetstream.JetStream, s Stream, policy RetryPolicy, queues []string) (jetstream.Stream, error) {
	s = s.withDefaults()
	policy = policy.withDefaults()
	horizon := policy.Horizon()
	why := func(window time.Duration) error {
		return fmt.Errorf("%w: stream %s has a duplicate window of %s, shorter than the retry horizon of %s "+
			"(%d attempts, backoff cap %s, consumer lease %s). A relay that publishes an effect again within the "+
			"horizon (after a crash, or when a hand-over lease expires) relies on Nats-Msg-Id deduplication; with "+
			"this window the stream could hold a second message for the effect. Raise the window "+
			"(nats stream edit %s --dupe-window %s) or lower the retry policy",
			ErrDuplicateWindow, s.Name, window, horizon, policy.MaxAttempts, policy.BackoffCap, policy.LeaseDuration,
			s.Name, roundUp(horizon))
	}
	for _, q := range queues {
		if err := checkToken(q); err != nil {
			return nil, fmt.Errorf("nats: queue %q cannot be relayed: %w", q, err)
		}
	}
	st, err := js.Stream(ctx, s.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		window := s.DuplicateWindow
		if window == 0 {
			window = roundUp(horizon)
		}
		if window < horizon {
			return nil, why(window)
		}
		storage := jetstream.FileStorage
		if s.Memory {
			storage = jetstream.MemoryStorage
		}
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        s.Name,
			Description: "pgoutbox relayed effects (one message per effect, Nats-Msg-Id = idempotency key)",
			Subjects:    []string{s.SubjectPrefix + ".>"},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     storage,
			Replicas:    s.Replicas,
			Duplicates:  window,
			AllowDirect: true,
		})
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("nats: create stream %s: %w", s.Name, err)
		}
		if err == nil {
			return st, nil
		}
		st, err = js.Stream(ctx, s.Name) // created concurrently by another process
	}
	if err != nil {
		return nil, fmt.Errorf("nats: stream %s: %w", s.Name, err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Duplicates < horizon {
		return nil, why(cfg.Duplicates)
	}
	if cfg.Retention != jetstream.WorkQueuePolicy {
		return nil, fmt.Errorf("%w: stream %s has %s retention; relayed effects need work-queue retention, "+
			"so that a consumed message leaves the stream and an effect published again (a replayed dead "+
			"letter) is recognised as new", ErrStreamConfig, s.Name, cfg.Retention)
	}
	for _, q := range queues {
		if !slices.Contains(cfg.Subjects, s.SubjectPrefix+".>") && !slices.Contains(cfg.Subjects, s.queueFilter(q)) {
			return nil, fmt.Errorf("%w: stream %s binds %v, not %s", ErrStreamConfig, s.Name, cfg.Subjects, s.queueFilter(q))
		}
	}
	return st, nil
}

func roundUp(d time.Duration) time.Duration {
	return (d + time.Minute - 1).Truncate(time.Minute)
}

// checkToken accepts a queue name usable as one subject token and in a
// consumer name.
func checkToken(s string) error {
	if s == "" || strings.ContainsAny(s, ".*> \t\r\n/\\") {
		return errors.New("a relayed queue name must be one NATS subject token (no '.', '*', '>', '/', '\\' or white space)")
	}
	return nil
}

// checkSubjectTail accepts an effect type usable as the tail of a subject.
func checkSubjectTail(s string) error {
	if s == "" || strings.ContainsAny(s, "*> \t\r\n") || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") ||
		strings.Contains(s, "..") {
		return fmt.Errorf("effect type %q is not usable in a NATS subject", s)
	}
	return nil
}

// Envelope is the body of a relayed message: what a consumer needs to take
// the effect over and deliver it. PostgreSQL stays authoritative; the
// consumer reads the attempt count from it at take-over.
type Envelope struct {
	// EffectID, Queue, Type and Key identify the effect; a take-over
	// matches id, type and key.
	EffectID int64  `json:"effect_id"`
	Queue    string `json:"queue"`
	Type     string `json:"type"`
	Key      string `json:"key"`
	// Payload is the effect's JSON payload.
	Payload json.RawMessage `json:"payload"`
	// Attempts is the number of deliveries made before the relay published
	// it; the take-over counts the next one.
	Attempts int `json:"attempts"`
	// MaxAttempts is the effect's max_attempts.
	MaxAttempts int `json:"max_attempts"`
	// CreatedAt is when the enqueuing transaction wrote the effect.
	CreatedAt time.Time `json:"created_at"`
	// RelayToken is the lease token of the relay that published the
	// message: a consumer may take the effect over with it before the
	// relay's hand-over commits.
	RelayToken string `json:"relay_token"`
}
