package projection

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Format is an import body's format.
type Format string

// Import formats, chosen by the request's Content-Type.
const (
	// FormatJSON is a JSON array of record objects (application/json).
	FormatJSON Format = "json"
	// FormatNDJSON is one record object per line (application/x-ndjson,
	// application/ndjson, application/jsonl).
	FormatNDJSON Format = "ndjson"
	// FormatCSV is RFC 4180 CSV with a header row that names an "id" column
	// (text/csv); every value is imported as a string.
	FormatCSV Format = "csv"
)

// MaxReportedErrors is how many rejected rows an import result lists; the
// count of rejected rows is always exact.
const MaxReportedErrors = 100

// ImportResult is what an import did.
type ImportResult struct {
	// Written counts rows that created or changed a record (Created+Updated).
	Written int64 `json:"written"`
	// Created and Updated split Written.
	Created int64 `json:"created"`
	Updated int64 `json:"updated"`
	// Unchanged counts rows identical to the stored record (nothing written,
	// nothing enqueued).
	Unchanged int64 `json:"unchanged"`
	// Rejected counts rows that were not written.
	Rejected int64 `json:"rejected"`
	// Errors lists the first MaxReportedErrors rejected rows.
	Errors []RowError `json:"errors"`
	// ErrorsTruncated is true when more rows were rejected than listed.
	ErrorsTruncated bool `json:"errors_truncated,omitempty"`
	// Transactions is how many transactions committed rows.
	Transactions int64 `json:"transactions"`
}

func (r *ImportResult) reject(e *RowError) {
	r.Rejected++
	if len(r.Errors) < MaxReportedErrors {
		r.Errors = append(r.Errors, *e)
	} else {
		r.ErrorsTruncated = true
	}
}

// ImportError is a fatal import error (the body is malformed as a whole, too
// large, or the database failed). Rows of transactions that committed before
// it stay written; Result says how many. Re-posting the same body is safe:
// rows already written are unchanged.
type ImportError struct {
	// Line is where the body became unreadable (0 when not about the body).
	Line int64
	// Reason explains the failure.
	Reason string
	// Err is the underlying error, if any.
	Err error
}

func (e *ImportError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s", e.Line, e.Reason)
	}
	return e.Reason
}

func (e *ImportError) Unwrap() error { return e.Err }

// importer streams rows into transactions of at most batch rows.
type importer struct {
	pool        *pgxpool.Pool
	batch       int
	maxRecord   int
	maxAttempts int

	res     ImportResult
	pending []parsed
	ids     map[string]bool
}

// Import streams body in the given format into storage_documents.records in
// transactions of at most batch rows, enqueuing record.upsert for every
// changed record in the same transaction. Memory is bounded by the batch and
// by maxRecord (the largest accepted row, in bytes), never by the body. A row
// that fails validation is rejected with its line number and the others are
// written; a body that cannot be read at all stops the import with an
// *ImportError (rows of already committed transactions stay written).
func Import(ctx context.Context, pool *pgxpool.Pool, format Format, body io.Reader, batch, maxRecord, maxAttempts int) (ImportResult, error) {
	if batch <= 0 {
		batch = ImportBatchDefault
	}
	if maxRecord <= 0 {
		maxRecord = MaxRecordBytesDefault
	}
	im := &importer{pool: pool, batch: batch, maxRecord: maxRecord, maxAttempts: maxAttempts, ids: map[string]bool{}}
	im.res.Errors = []RowError{}
	var err error
	switch format {
	case FormatJSON:
		err = im.jsonArray(ctx, body)
	case FormatNDJSON:
		err = im.ndjson(ctx, body)
	case FormatCSV:
		err = im.csv(ctx, body)
	default:
		err = &ImportError{Reason: fmt.Sprintf("unknown format %q", format)}
	}
	if err == nil {
		err = im.flush(ctx)
	}
	return im.res, err
}

// add queues a valid row, flushing first when the batch is full or already
// holds the same id (a later row of the same id is a later version).
func (im *importer) add(ctx context.Context, p parsed) error {
	if len(im.pending) >= im.batch || im.ids[p.id] {
		if err := im.flush(ctx); err != nil {
			return err
		}
	}
	im.pending = append(im.pending, p)
	im.ids[p.id] = true
	return nil
}

// row validates raw and queues it or records the rejection.
func (im *importer) row(ctx context.Context, raw []byte, line int64) error {
	p, err := parseRecord(raw, line, im.maxRecord)
	if err != nil {
		var re *RowError
		if errors.As(err, &re) {
			im.res.reject(re)
			return nil
		}
		return err
	}
	return im.add(ctx, p)
}

func (im *importer) flush(ctx context.Context) error {
	if len(im.pending) == 0 {
		return nil
	}
	var out []written
	err := pgx.BeginFunc(ctx, im.pool, func(tx pgx.Tx) error {
		var err error
		out, err = writeBatch(ctx, tx, im.pending, im.maxAttempts)
		return err
	})
	if err != nil {
		return &ImportError{Reason: "database: " + err.Error(), Err: err}
	}
	im.res.Transactions++
	for _, w := range out {
		switch w.status {
		case StatusCreated:
			im.res.Created++
			im.res.Written++
		case StatusUpdated:
			im.res.Updated++
			im.res.Written++
		default:
			im.res.Unchanged++
		}
	}
	im.pending = im.pending[:0]
	clear(im.ids)
	return nil
}

// ndjson reads one record per line; blank lines are skipped. A line longer
// than maxRecord is rejected without being held in memory.
func (im *importer) ndjson(ctx context.Context, body io.Reader) error {
	br := bufio.NewReaderSize(body, im.maxRecord+2)
	var line int64
	for {
		line++
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			im.res.reject(&RowError{Line: line, Reason: fmt.Sprintf("line is longer than the %d-byte record limit", im.maxRecord)})
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return readError(line, err)
			}
			continue
		}
		if err != nil && err != io.EOF {
			return readError(line, err)
		}
		trimmed := bytes.TrimSpace(b)
		if line == 1 {
			trimmed = bytes.TrimPrefix(trimmed, utf8BOM)
		}
		if len(trimmed) > 0 {
			if rerr := im.row(ctx, trimmed, line); rerr != nil {
				return rerr
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// readError turns a failure to read the body into an ImportError; a body
// over the size limit keeps its *http.MaxBytesError for the caller.
func readError(line int64, err error) error {
	return &ImportError{Line: line, Reason: "reading the body: " + err.Error(), Err: err}
}

// csv reads a header row naming the columns (one must be "id") and one
// record per row; every value is a string.
func (im *importer) csv(ctx context.Context, body io.Reader) error {
	cr := csv.NewReader(bufio.NewReaderSize(body, 64<<10))
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err == io.EOF {
		return &ImportError{Line: 1, Reason: "empty CSV: a header row naming an \"id\" column is required"}
	}
	if err != nil {
		return csvFatal(err)
	}
	cols := make([]string, len(header))
	seen := map[string]bool{}
	for i, h := range header {
		h = strings.TrimSpace(h)
		if i == 0 {
			h = strings.TrimPrefix(h, "\ufeff")
		}
		if h == "" {
			return &ImportError{Line: 1, Reason: fmt.Sprintf("CSV header: column %d has no name", i+1)}
		}
		if seen[h] {
			return &ImportError{Line: 1, Reason: fmt.Sprintf("CSV header: column %q appears twice", h)}
		}
		seen[h] = true
		cols[i] = h
	}
	if !seen["id"] {
		return &ImportError{Line: 1, Reason: `CSV header: no "id" column`}
	}
	cr.FieldsPerRecord = len(cols)
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) && pe.StartLine > 0 {
				reason := pe.Err.Error()
				if errors.Is(pe.Err, csv.ErrFieldCount) {
					reason = fmt.Sprintf("has %d fields, the header has %d", len(rec), len(cols))
				}
				im.res.reject(&RowError{Line: int64(pe.StartLine), Reason: "CSV: " + reason})
				continue
			}
			return csvFatal(err)
		}
		line, _ := cr.FieldPos(0)
		size := 0
		obj := make(map[string]any, len(cols))
		for i, v := range rec {
			size += len(v) + len(cols[i])
			obj[cols[i]] = v
		}
		if size > im.maxRecord {
			im.res.reject(&RowError{Line: int64(line), Reason: fmt.Sprintf("row is over the %d-byte record limit", im.maxRecord)})
			continue
		}
		p, err := fromObject(obj, int64(line))
		if err != nil {
			var re *RowError
			if errors.As(err, &re) {
				im.res.reject(re)
				continue
			}
			return err
		}
		if err := im.add(ctx, p); err != nil {
			return err
		}
	}
}

func csvFatal(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &ImportError{Line: int64(pe.StartLine), Reason: "CSV: " + pe.Err.Error(), Err: err}
	}
	return readError(0, err)
}

// jsonArray streams the elements of a top-level JSON array. It splits
// elements itself (tracking strings, escapes and nesting) so that each
// element is held in memory alone and carries the line it starts on; an
// element that is not a valid record is rejected, while a body that is not a
// JSON array (or ends in the middle of one) stops the import.
func (im *importer) jsonArray(ctx context.Context, body io.Reader) error {
	s := &arrayScanner{r: bufio.NewReaderSize(body, 64<<10), line: 1, max: im.maxRecord}
	c, err := s.skipSpace()
	if err == io.EOF {
		return &ImportError{Line: 1, Reason: "empty body: expected a JSON array"}
	}
	if err != nil {
		return readError(s.line, err)
	}
	if c == 0xEF { // UTF-8 byte order mark
		for range 2 {
			if _, err := s.r.ReadByte(); err != nil {
				return readError(s.line, err)
			}
		}
		if c, err = s.skipSpace(); err != nil {
			return &ImportError{Line: s.line, Reason: "expected a JSON array"}
		}
	}
	if c != '[' {
		return &ImportError{Line: s.line, Reason: "expected a JSON array (a body starting with '[')"}
	}
	first := true
	for {
		c, err := s.skipSpace()
		if err != nil {
			return s.eofError(err)
		}
		if c == ']' && first {
			return s.expectEnd()
		}
		if !first {
			switch c {
			case ']':
				return s.expectEnd()
			case ',':
				if c, err = s.skipSpace(); err != nil {
					return s.eofError(err)
				}
			default:
				return &ImportError{Line: s.line, Reason: fmt.Sprintf("expected ',' or ']' after an array element, found %q", c)}
			}
		}
		first = false
		start := s.line
		raw, over, last, err := s.element(c)
		if err != nil {
			return s.eofError(err)
		}
		if over {
			im.res.reject(&RowError{Line: start, Reason: fmt.Sprintf("record is over the %d-byte limit", im.maxRecord)})
		} else if rerr := im.row(ctx, raw, start); rerr != nil {
			return rerr
		}
		if last != 0 {
			if err := s.r.UnreadByte(); err != nil {
				return readError(s.line, err)
			}
			if last == '\n' {
				s.line--
			}
		}
	}
}

// arrayScanner splits a JSON array into raw elements.
type arrayScanner struct {
	r    *bufio.Reader
	line int64
	max  int
	buf  []byte
}

func (s *arrayScanner) next() (byte, error) {
	c, err := s.r.ReadByte()
	if c == '\n' && err == nil {
		s.line++
	}
	return c, err
}

func (s *arrayScanner) skipSpace() (byte, error) {
	for {
		c, err := s.next()
		if err != nil {
			return 0, err
		}
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c, nil
		}
	}
}

func (s *arrayScanner) eofError(err error) error {
	if err == io.EOF {
		return &ImportError{Line: s.line, Reason: "unexpected end of body inside the JSON array"}
	}
	return readError(s.line, err)
}

// expectEnd allows only whitespace after the closing bracket.
func (s *arrayScanner) expectEnd() error {
	_, err := s.skipSpace()
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return readError(s.line, err)
	}
	return &ImportError{Line: s.line, Reason: "unexpected data after the JSON array"}
}

// element reads one value starting with c. For a scalar it returns the
// delimiter that ended it in last (to be unread). over is true when the
// element was longer than the limit (its bytes were dropped).
func (s *arrayScanner) element(c byte) (raw []byte, over bool, last byte, err error) {
	s.buf = s.buf[:0]
	keep := func(b byte) {
		if over {
			return
		}
		if len(s.buf) >= s.max {
			over = true
			s.buf = s.buf[:0]
			return
		}
		s.buf = append(s.buf, b)
	}
	keep(c)
	switch c {
	case '{', '[':
		depth, inString, escaped := 1, false, false
		for depth > 0 {
			b, err := s.next()
			if err != nil {
				return nil, false, 0, err
			}
			keep(b)
			switch {
			case inString && escaped:
				escaped = false
			case inString && b == '\\':
				escaped = true
			case inString && b == '"':
				inString = false
			case inString:
			case b == '"':
				inString = true
			case b == '{' || b == '[':
				depth++
			case b == '}' || b == ']':
				depth--
			}
		}
	case '"':
		escaped := false
		for {
			b, err := s.next()
			if err != nil {
				return nil, false, 0, err
			}
			keep(b)
			if escaped {
				escaped = false
			} else if b == '\\' {
				escaped = true
			} else if b == '"' {
				break
			}
		}
	default:
		for {
			b, err := s.next()
			if err != nil {
				return nil, false, 0, err
			}
			if b == ',' || b == ']' || b == ' ' || b == '\t' || b == '\n' || b == '\r' {
				return s.buf, over, b, nil
			}
			keep(b)
		}
	}
	return s.buf, over, 0, nil
}
