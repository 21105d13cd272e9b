package projection

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// RecordResponse answers POST /api/records.
type RecordResponse struct {
	ID         string `json:"id"`
	Status     string `json:"status"` // created, updated or unchanged
	Version    int64  `json:"version,omitempty"`
	SourceHash string `json:"source_hash"`
	// EffectID is the record.upsert effect enqueued with the change (absent
	// when unchanged).
	EffectID int64 `json:"effect_id,omitempty"`
}

// mediaType returns the request's media type, lower-cased, without
// parameters ("" when absent or unparsable).
func mediaType(r *http.Request) string {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return ""
	}
	return strings.ToLower(mt)
}

// tooLarge reports whether err is a body over http.MaxBytesReader's limit.
func tooLarge(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

func (a *App) postRecord(w http.ResponseWriter, r *http.Request) {
	if mt := mediaType(r); mt != "application/json" {
		httpx.Error(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
		return
	}
	if r.ContentLength > int64(a.cfg.MaxRecordBytes) {
		httpx.Error(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("record is over the %d-byte limit", a.cfg.MaxRecordBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(a.cfg.MaxRecordBytes)))
	if err != nil {
		if tooLarge(err) {
			httpx.Error(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("record is over the %d-byte limit", a.cfg.MaxRecordBytes))
			return
		}
		httpx.Error(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	p, err := parseRecord(body, 1, a.cfg.MaxRecordBytes)
	if err != nil {
		var re *RowError
		if errors.As(err, &re) {
			httpx.Error(w, http.StatusBadRequest, re.Reason)
			return
		}
		httpx.Error(w, http.StatusBadRequest, err.Error())
		return
	}
	var out []written
	err = pgx.BeginFunc(r.Context(), a.pool, func(tx pgx.Tx) error {
		var err error
		out, err = writeBatch(r.Context(), tx, []parsed{p}, a.cfg.MaxAttempts)
		return err
	})
	if err != nil {
		a.cfg.Logger.Error("write record failed", "err", err)
		httpx.Error(w, http.StatusInternalServerError, "the record could not be written")
		return
	}
	res := out[0]
	status := http.StatusOK
	if res.status == StatusCreated {
		status = http.StatusCreated
	}
	httpx.WriteJSON(w, status, RecordResponse{ID: res.id, Status: res.status, Version: res.version, SourceHash: res.hash, EffectID: res.effectID})
}

func (a *App) getRecord(w http.ResponseWriter, r *http.Request) {
	rec, found, err := GetRecord(r.Context(), a.pool, r.PathValue("id"))
	if err != nil {
		a.cfg.Logger.Error("read record failed", "err", err)
		httpx.Error(w, http.StatusInternalServerError, "the record could not be read")
		return
	}
	if !found {
		httpx.Error(w, http.StatusNotFound, "no such record")
		return
	}
	httpx.WriteJSON(w, http.StatusOK, rec)
}

// SearchResponse answers GET /api/records.
type SearchResponse struct {
	Records []Record `json:"records"`
	// Next is the ?after= value of the next page (listing without q only).
	Next string `json:"next,omitempty"`
}

func (a *App) searchRecords(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := SearchLimitDefault
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > SearchLimitMax {
			httpx.Error(w, http.StatusBadRequest, fmt.Sprintf("limit must be between 1 and %d", SearchLimitMax))
			return
		}
		limit = n
	}
	var recs []Record
	var err error
	if text := strings.TrimSpace(q.Get("q")); text != "" {
		recs, err = SearchRecords(r.Context(), a.pool, text, limit)
	} else {
		recs, err = ListRecords(r.Context(), a.pool, q.Get("after"), limit)
	}
	if err != nil {
		a.cfg.Logger.Error("search records failed", "err", err)
		httpx.Error(w, http.StatusInternalServerError, "the search failed")
		return
	}
	resp := SearchResponse{Records: recs}
	if resp.Records == nil {
		resp.Records = []Record{}
	}
	if q.Get("q") == "" && len(recs) == limit {
		resp.Next = recs[len(recs)-1].ID
	}
	httpx.WriteJSON(w, http.StatusOK, resp)
}

// importFormat maps a Content-Type to an import format.
func importFormat(mt string) (Format, bool) {
	switch mt {
	case "application/json":
		return FormatJSON, true
	case "application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines", "application/jsonlines":
		return FormatNDJSON, true
	case "text/csv", "application/csv":
		return FormatCSV, true
	}
	return "", false
}

func (a *App) postImport(w http.ResponseWriter, r *http.Request) {
	format, ok := importFormat(mediaType(r))
	if !ok {
		httpx.Error(w, http.StatusUnsupportedMediaType,
			"Content-Type must be application/json (a JSON array), application/x-ndjson or text/csv")
		return
	}
	if r.ContentLength > a.cfg.MaxImportBytes {
		httpx.Error(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("import body is over the %d-byte limit", a.cfg.MaxImportBytes))
		return
	}
	body := http.MaxBytesReader(w, r.Body, a.cfg.MaxImportBytes)
	res, err := Import(r.Context(), a.pool, format, body, a.cfg.ImportBatch, a.cfg.MaxRecordBytes, a.cfg.MaxAttempts)
	if err != nil {
		var ie *ImportError
		status, msg, line := http.StatusInternalServerError, "the import failed", int64(0)
		switch {
		case tooLarge(err):
			status, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("import body is over the %d-byte limit", a.cfg.MaxImportBytes)
		case errors.As(err, &ie) && strings.HasPrefix(ie.Reason, "database:"):
			a.cfg.Logger.Error("import failed", "err", err)
			msg = "the import failed in the database; rows of committed transactions stay written, re-post to resume"
		case errors.As(err, &ie):
			status, msg, line = http.StatusBadRequest, ie.Error(), ie.Line
		default:
			a.cfg.Logger.Error("import failed", "err", err)
		}
		httpx.WriteJSON(w, status, importErrorBody{Error: msg, Line: line, Result: &res})
		return
	}
	httpx.WriteJSON(w, http.StatusOK, res)
}
