package solrtest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// project keeps the fields named by fl ("" or "*": all).
func project(d doc, fl string) doc {
	if fl == "" || fl == "*" {
		return d
	}
	out := doc{}
	for _, f := range strings.Split(fl, ",") {
		f = strings.TrimSpace(f)
		if f == "*" {
			return d
		}
		if v, ok := d[f]; ok {
			out[f] = v
		}
	}
	return out
}

// handleGet is the real-time get handler: it sees every update at once,
// committed or not. ?id=x answers {"doc": …|null}; ?ids=a,b answers a
// response list.
func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	c := s.coreOf(w, r)
	if c == nil {
		return
	}
	q := r.URL.Query()
	fl := q.Get("fl")
	s.mu.Lock()
	defer s.mu.Unlock()
	if ids := q.Get("ids"); ids != "" {
		var docs []doc
		for _, id := range strings.Split(ids, ",") {
			for _, d := range c.live[id] {
				docs = append(docs, project(d, fl))
			}
		}
		if docs == nil {
			docs = []doc{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"response": map[string]any{"numFound": len(docs), "start": 0, "numFoundExact": true, "docs": docs}})
		return
	}
	var out any
	if ds := c.live[q.Get("id")]; len(ds) > 0 {
		out = project(ds[len(ds)-1], fl)
	}
	writeJSON(w, http.StatusOK, map[string]any{"doc": out})
}

// matches evaluates the emulated query syntax: "*:*", or "field:value"
// (value optionally quoted) compared with the field's string form, any
// element of a multi-valued field matching.
func matches(d doc, query string) bool {
	query = strings.TrimSpace(query)
	if query == "" || query == "*:*" {
		return true
	}
	field, value, ok := strings.Cut(query, ":")
	if !ok {
		return false
	}
	value = strings.TrimSpace(value)
	if uq, err := strconv.Unquote(value); err == nil {
		value = uq
	}
	if value == "*" {
		_, has := d[field]
		return has
	}
	eq := func(v any) bool {
		switch x := v.(type) {
		case string:
			return x == value
		case json.Number:
			return x.String() == value
		case bool:
			return strconv.FormatBool(x) == value
		}
		return false
	}
	switch v := d[field].(type) {
	case []any:
		for _, e := range v {
			if eq(e) {
				return true
			}
		}
		return false
	default:
		return eq(v)
	}
}

// handleSelect searches what is committed (updates become visible at their
// commitWithin deadline or on commit). Emulated parameters: q, fq
// (repeatable), start, rows (default 10), fl.
func (s *Server) handleSelect(w http.ResponseWriter, r *http.Request) {
	c := s.coreOf(w, r)
	if c == nil {
		return
	}
	if err := r.ParseForm(); err != nil {
		solrError(w, http.StatusBadRequest, err.Error())
		return
	}
	q := r.Form
	start, rows := 0, 10
	if v := q.Get("start"); v != "" {
		start, _ = strconv.Atoi(v)
	}
	if v := q.Get("rows"); v != "" {
		rows, _ = strconv.Atoi(v)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applyDueLocked(c, false)
	var hits []doc
	for _, id := range c.order {
		for _, d := range c.index[id] {
			ok := matches(d, q.Get("q"))
			for _, fq := range q["fq"] {
				ok = ok && matches(d, fq)
			}
			if ok {
				hits = append(hits, d)
			}
		}
	}
	docs := []doc{}
	for i := start; i < len(hits) && i < start+rows; i++ {
		docs = append(docs, project(hits[i], q.Get("fl")))
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"responseHeader": map[string]any{"status": 0, "QTime": 0},
		"response":       map[string]any{"numFound": len(hits), "start": start, "numFoundExact": true, "docs": docs},
	})
}
