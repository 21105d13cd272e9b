package projection

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// Queue is the engine queue of the projection's effects.
const Queue = "outbox_events"

// EffectType is the projection's one effect type: project the current state
// of a record to every enabled target. It is replay-safe.
const EffectType = "record.upsert"

// MaxIDLength is the longest record id, in bytes.
const MaxIDLength = 512

// Record is one row of storage_documents.records.
type Record struct {
	// ID is the record's id (the document's "id", as text).
	ID string `json:"id"`
	// Document is the record as posted: a JSON object carrying "id".
	Document json.RawMessage `json:"document"`
	// SourceHash is the hex SHA-256 of the canonical JSON of Document.
	SourceHash string `json:"source_hash"`
	// Version is 1 on insert and grows by one on every change.
	Version int64 `json:"version"`
	// CreatedAt and UpdatedAt are database timestamps.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Payload is the JSON payload of a record.upsert effect. It names the record
// version that caused it; the document itself is read from the database at
// delivery time, so a delivery always projects the record's current state and
// the payload never carries record content.
type Payload struct {
	RecordID   string `json:"record_id"`
	Version    int64  `json:"version"`
	SourceHash string `json:"source_hash"`
}

// EffectKey is the idempotency key of a record version's effect:
// pgoutbox.Key("record.upsert", recordID, sourceHash).
func EffectKey(recordID, sourceHash string) string {
	return pgoutbox.Key(EffectType, recordID, sourceHash)
}

// revertKey names the follow-up effect of a record whose content went back to
// a source hash that already has a delivered (or in-flight) effect.
func revertKey(recordID, sourceHash string, version int64) string {
	return pgoutbox.Key(EffectType, recordID, sourceHash, fmt.Sprint(version))
}

// RowError says why an input row was rejected.
type RowError struct {
	// Line is the 1-based line of the input where the row starts (for a
	// single record, 1).
	Line int64 `json:"line"`
	// Reason is a human-readable explanation; it never quotes the row.
	Reason string `json:"reason"`
}

func (e *RowError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Reason) }

// parsed is a validated input row ready to be written.
type parsed struct {
	id       string
	document []byte // canonical JSON
	hash     string
	line     int64
}

// parseRecord validates one JSON value as a record: a JSON object whose "id"
// is a non-empty string or a number (kept as its text). The document is
// stored in canonical form (keys sorted, insignificant whitespace removed,
// numbers as written), and the source hash is the SHA-256 of that form. It
// must nest at most pgoutbox.MaxPayloadDepth deep and carry no number over
// pgoutbox.MaxNumberLength characters or with an exponent beyond
// pgoutbox.MaxNumberExponent.
func parseRecord(raw []byte, line int64, maxBytes int) (parsed, error) {
	if maxBytes > 0 && len(raw) > maxBytes {
		return parsed{}, &RowError{Line: line, Reason: fmt.Sprintf("record is %d bytes, over the %d-byte limit", len(raw), maxBytes)}
	}
	// Bounded before the documents are parsed into jsonb (issue 27): the
	// engine's depth and number bounds (pgoutbox.CheckJSONBounds).
	var be *pgoutbox.JSONBoundsError
	if err := pgoutbox.CheckJSONBounds(raw); errors.As(err, &be) {
		return parsed{}, &RowError{Line: line, Reason: "the record " + be.Reason}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return parsed{}, &RowError{Line: line, Reason: "invalid JSON: " + jsonReason(err)}
	}
	if dec.More() {
		return parsed{}, &RowError{Line: line, Reason: "invalid JSON: more than one value"}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return parsed{}, &RowError{Line: line, Reason: "a record must be a JSON object"}
	}
	return fromObject(obj, line)
}

// fromObject validates a decoded object and computes its canonical form.
func fromObject(obj map[string]any, line int64) (parsed, error) {
	var id string
	switch x := obj["id"].(type) {
	case nil:
		return parsed{}, &RowError{Line: line, Reason: `missing "id"`}
	case string:
		id = x
	case json.Number:
		id = x.String()
	default:
		return parsed{}, &RowError{Line: line, Reason: `"id" must be a string or a number`}
	}
	switch {
	case strings.TrimSpace(id) == "":
		return parsed{}, &RowError{Line: line, Reason: `"id" is empty`}
	case len(id) > MaxIDLength:
		return parsed{}, &RowError{Line: line, Reason: fmt.Sprintf(`"id" is longer than %d bytes`, MaxIDLength)}
	case !utf8.ValidString(id) || strings.ContainsRune(id, 0):
		return parsed{}, &RowError{Line: line, Reason: `"id" is not valid text`}
	}
	if anyString(obj, func(s string) bool { return !utf8.ValidString(s) }) {
		// Stored text must read back byte for byte, or its hash would change.
		return parsed{}, &RowError{Line: line, Reason: "the record contains text that is not valid UTF-8"}
	}
	if hasNUL(obj) {
		// PostgreSQL's jsonb cannot store \u0000.
		return parsed{}, &RowError{Line: line, Reason: `the record contains a \u0000 character, which cannot be stored`}
	}
	canon, err := json.Marshal(obj) // map keys sorted; json.Number kept verbatim
	if err != nil {
		return parsed{}, &RowError{Line: line, Reason: "cannot encode record: " + err.Error()}
	}
	sum := sha256.Sum256(canon)
	return parsed{id: id, document: canon, hash: hex.EncodeToString(sum[:]), line: line}, nil
}

// anyString reports whether bad holds for any key or string value in v.
func anyString(v any, bad func(string) bool) bool {
	switch x := v.(type) {
	case string:
		return bad(x)
	case map[string]any:
		for k, e := range x {
			if bad(k) || anyString(e, bad) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if anyString(e, bad) {
				return true
			}
		}
	}
	return false
}

func hasNUL(v any) bool {
	return anyString(v, func(s string) bool { return strings.ContainsRune(s, 0) })
}

// jsonReason shortens a decoding error to its cause, never quoting input.
func jsonReason(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return se.Error()
	case errors.As(err, &te):
		return "unexpected " + te.Value
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "unexpected end of input"
	}
	return err.Error()
}

// Outcome of writing one record.
const (
	StatusCreated   = "created"
	StatusUpdated   = "updated"
	StatusUnchanged = "unchanged"
)

// written is the result of one record of a batch.
type written struct {
	id       string
	status   string
	version  int64
	hash     string
	effectID int64
}

// writeBatch upserts records (ids unique within the batch) and enqueues one
// record.upsert per changed record, in tx. Unchanged records write nothing.
func writeBatch(ctx context.Context, tx pgx.Tx, rows []parsed, maxAttempts int) ([]written, error) {
	ids, docs, hashes := make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows))
	for i, r := range rows {
		ids[i], docs[i], hashes[i] = r.id, string(r.document), r.hash
	}
	res, err := tx.Query(ctx, upsertSQL, ids, docs, hashes)
	if err != nil {
		return nil, fmt.Errorf("upsert records: %w", err)
	}
	changed := map[string]written{}
	for res.Next() {
		var w written
		var inserted bool
		if err := res.Scan(&w.id, &w.version, &w.hash, &inserted); err != nil {
			res.Close()
			return nil, fmt.Errorf("upsert records: %w", err)
		}
		w.status = StatusUpdated
		if inserted {
			w.status = StatusCreated
		}
		changed[w.id] = w
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("upsert records: %w", err)
	}
	out := make([]written, len(rows))
	if len(changed) > 0 {
		keys := make([]string, 0, len(changed))
		for _, w := range changed {
			keys = append(keys, EffectKey(w.id, w.hash))
		}
		// Keys that already name an effect no longer waiting in the queue
		// (a record reverted to content it had before: the effect for that
		// content was already delivered or is in flight, so a follow-up
		// effect is needed).
		done, err := pgoutbox.KeysPastAvailable(ctx, tx, Queue, keys)
		if err != nil {
			return nil, fmt.Errorf("look up effects: %w", err)
		}
		seen := make(map[string]bool, len(done))
		for _, k := range done {
			seen[k] = true
		}
		effects := make([]pgoutbox.Effect, 0, len(changed))
		order := make([]string, 0, len(changed))
		for _, r := range rows {
			w, ok := changed[r.id]
			if !ok {
				continue
			}
			key := EffectKey(w.id, w.hash)
			if seen[key] {
				key = revertKey(w.id, w.hash, w.version)
			}
			// Ordered by record id: a record's versions reach the targets
			// in commit order (docs/design.md, "Per-key ordering"); the
			// version checks stay as defence in depth.
			effects = append(effects, pgoutbox.Effect{
				Queue: Queue, Type: EffectType, Key: key, MaxAttempts: maxAttempts,
				Payload:     Payload{RecordID: w.id, Version: w.version, SourceHash: w.hash},
				OrderingKey: w.id,
			})
			order = append(order, w.id)
		}
		effIDs, err := pgoutbox.EnqueueBatch(ctx, tx, effects)
		if err != nil {
			return nil, fmt.Errorf("enqueue record.upsert: %w", err)
		}
		for i, id := range order {
			w := changed[id]
			w.effectID = effIDs[i]
			changed[id] = w
		}
	}
	for i, r := range rows {
		if w, ok := changed[r.id]; ok {
			out[i] = w
			continue
		}
		out[i] = written{id: r.id, status: StatusUnchanged, hash: r.hash}
	}
	return out, nil
}

// queryRecords runs a records query and collects the rows.
func queryRecords(ctx context.Context, db pgoutbox.DB, sql string, args ...any) ([]Record, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Record, error) {
		var rec Record
		err := r.Scan(&rec.ID, &rec.Document, &rec.SourceHash, &rec.Version, &rec.CreatedAt, &rec.UpdatedAt)
		return rec, err
	})
}

// GetRecord reads one record; found is false when it does not exist.
func GetRecord(ctx context.Context, db pgoutbox.DB, id string) (rec Record, found bool, err error) {
	recs, err := queryRecords(ctx, db, getRecordSQL, id)
	if err != nil || len(recs) == 0 {
		return Record{}, false, err
	}
	return recs[0], true, nil
}

// SearchRecords is a full-text search over every string value of the
// records (PostgreSQL websearch syntax), best match first.
func SearchRecords(ctx context.Context, db pgoutbox.DB, q string, limit int) ([]Record, error) {
	return queryRecords(ctx, db, searchRecordsSQL, q, limit)
}

// ListRecords returns up to limit records with ids after the given one, by id.
func ListRecords(ctx context.Context, db pgoutbox.DB, after string, limit int) ([]Record, error) {
	return queryRecords(ctx, db, listRecordsSQL, after, limit)
}

// CountRecords returns the number of records.
func CountRecords(ctx context.Context, db pgoutbox.DB) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, countRecordsSQL).Scan(&n)
	return n, err
}
