package solrtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// updateCmd is one parsed command of a JSON update request.
type updateCmd struct {
	kind         string // "add", "delete", "commit"
	doc          doc
	overwrite    bool
	commitWithin time.Duration // <0: none
	deleteID     string
}

// errBadRequest is a 400 with Solr's message.
type errBadRequest struct{ msg string }

func (e errBadRequest) Error() string { return e.msg }

// parseUpdate reads Solr's JSON update syntax: either an array of documents,
// or an object of commands where keys may repeat ("add" several times):
//
//	{"add": {"doc": {...}, "overwrite": true, "commitWithin": 1000},
//	 "add": {"doc": {...}}, "delete": {"id": "x"}, "delete": ["a", "b"],
//	 "commit": {}}
func parseUpdate(body []byte, overwrite bool, commitWithin time.Duration) ([]updateCmd, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, errBadRequest{"Cannot parse provided JSON: " + err.Error()}
	}
	var cmds []updateCmd
	switch tok {
	case json.Delim('['):
		for dec.More() {
			var d map[string]any
			if err := dec.Decode(&d); err != nil {
				return nil, errBadRequest{"Cannot parse provided JSON: " + err.Error()}
			}
			cmds = append(cmds, updateCmd{kind: "add", doc: d, overwrite: overwrite, commitWithin: commitWithin})
		}
		return cmds, nil
	case json.Delim('{'):
	default:
		return nil, errBadRequest{"Cannot parse provided JSON: expected an array of documents or an object of commands"}
	}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, errBadRequest{"Cannot parse provided JSON: " + err.Error()}
		}
		key, _ := kt.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, errBadRequest{"Cannot parse provided JSON: " + err.Error()}
		}
		switch key {
		case "add":
			var a struct {
				Doc          map[string]any `json:"doc"`
				Overwrite    *bool          `json:"overwrite"`
				CommitWithin *int64         `json:"commitWithin"`
			}
			d := json.NewDecoder(bytes.NewReader(raw))
			d.UseNumber()
			if err := d.Decode(&a); err != nil {
				return nil, errBadRequest{"Cannot parse provided JSON: add: " + err.Error()}
			}
			if a.Doc == nil {
				return nil, errBadRequest{"Document is missing mandatory uniqueKey field: id"}
			}
			cmd := updateCmd{kind: "add", doc: a.Doc, overwrite: overwrite, commitWithin: commitWithin}
			if a.Overwrite != nil {
				cmd.overwrite = *a.Overwrite
			}
			if a.CommitWithin != nil {
				cmd.commitWithin = time.Duration(*a.CommitWithin) * time.Millisecond
			}
			cmds = append(cmds, cmd)
		case "delete":
			var ids []string
			var one string
			var obj struct {
				ID string `json:"id"`
			}
			switch {
			case json.Unmarshal(raw, &one) == nil:
				ids = []string{one}
			case json.Unmarshal(raw, &ids) == nil:
			case json.Unmarshal(raw, &obj) == nil && obj.ID != "":
				ids = []string{obj.ID}
			default:
				return nil, errBadRequest{"delete: only delete by id is emulated"}
			}
			for _, id := range ids {
				cmds = append(cmds, updateCmd{kind: "delete", deleteID: id, commitWithin: commitWithin})
			}
		case "commit":
			cmds = append(cmds, updateCmd{kind: "commit"})
		case "optimize", "rollback":
		default:
			return nil, errBadRequest{fmt.Sprintf("Unknown command '%s'", key)}
		}
	}
	return cmds, nil
}

// idOf returns a document's uniqueKey as a string.
func idOf(d doc) (string, bool) {
	switch v := d["id"].(type) {
	case string:
		return v, v != ""
	case json.Number:
		return v.String(), true
	}
	return "", false
}

// versionOf returns the _version_ a document asks for (0 when absent).
func versionOf(d doc) (int64, error) {
	switch v := d["_version_"].(type) {
	case nil:
		return 0, nil
	case json.Number:
		return v.Int64()
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, errors.New("bad _version_")
}

func (s *Server) handleUpdate(w http.ResponseWriter, r *http.Request) {
	c := s.coreOf(w, r)
	if c == nil {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" && mt != "text/json" {
		solrError(w, http.StatusUnsupportedMediaType, "Unsupported ContentType: "+r.Header.Get("Content-Type")+"  Not in: [application/json, text/json]")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		solrError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	q := r.URL.Query()
	overwrite := q.Get("overwrite") != "false"
	commitWithin := time.Duration(-1)
	if v := q.Get("commitWithin"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			solrError(w, http.StatusBadRequest, "commitWithin: not a number")
			return
		}
		commitWithin = time.Duration(ms) * time.Millisecond
	}
	cmds, err := parseUpdate(body, overwrite, commitWithin)
	if err != nil {
		solrError(w, http.StatusBadRequest, err.Error())
		return
	}
	if q.Get("commit") == "true" || q.Get("softCommit") == "true" {
		cmds = append(cmds, updateCmd{kind: "commit"})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.notifyLocked()
	var adds []any
	docs := 0
	for _, cmd := range cmds {
		switch cmd.kind {
		case "commit":
			s.applyDueLocked(c, true)
		case "delete":
			delete(c.live, cmd.deleteID)
			c.pending = append(c.pending, pendingOp{id: cmd.deleteID, due: dueAt(s.opts.Clock(), cmd.commitWithin)})
		case "add":
			id, ok := idOf(cmd.doc)
			if !ok {
				solrError(w, http.StatusBadRequest, "Document is missing mandatory uniqueKey field: id")
				return
			}
			want, err := versionOf(cmd.doc)
			if err != nil {
				solrError(w, http.StatusBadRequest, "Invalid _version_ for document "+id)
				return
			}
			if msg := checkFieldNames(id, cmd.doc); msg != "" {
				s.recordDocsLocked(r, docs)
				solrError(w, http.StatusBadRequest, msg)
				return
			}
			if msg := checkDynamicFields(id, cmd.doc); msg != "" {
				s.recordDocsLocked(r, docs)
				solrError(w, http.StatusBadRequest, msg)
				return
			}
			existing := c.live[id]
			var actual int64
			if len(existing) > 0 {
				actual, _ = versionOf(existing[len(existing)-1])
			}
			conflict := false
			switch {
			case want > 1:
				conflict = actual != want
			case want == 1:
				conflict = len(existing) == 0
			case want < 0:
				conflict = len(existing) > 0
			}
			if conflict {
				// Solr applies the commands before the failing one and stops.
				s.recordDocsLocked(r, docs)
				solrError(w, http.StatusConflict, fmt.Sprintf("version conflict for %s expected=%d actual=%d", id, want, actual))
				return
			}
			d := make(doc, len(cmd.doc))
			for k, v := range cmd.doc {
				d[k] = v
			}
			v := s.nextVersionLocked()
			d["_version_"] = json.Number(strconv.FormatInt(v, 10))
			replace := cmd.overwrite || want != 0
			if len(existing) == 0 {
				c.order = append(c.order, id)
			}
			if replace {
				c.live[id] = []doc{d}
			} else {
				c.live[id] = append(c.live[id], d)
			}
			c.pending = append(c.pending, pendingOp{id: id, doc: d, replace: replace, due: dueAt(s.opts.Clock(), cmd.commitWithin)})
			adds = append(adds, id, v)
			docs++
		}
	}
	s.recordDocsLocked(r, docs)
	resp := map[string]any{"responseHeader": map[string]any{"status": 0, "QTime": 0}}
	if r.URL.Query().Get("versions") == "true" {
		resp["adds"] = adds
	}
	writeJSON(w, http.StatusOK, resp)
}

// dueAt is when an update becomes visible: now+commitWithin, or never
// (zero) without commitWithin until an explicit commit.
func dueAt(now time.Time, commitWithin time.Duration) time.Time {
	if commitWithin < 0 {
		return time.Time{}
	}
	return now.Add(commitWithin)
}

// dynamicTypes are the typed dynamic fields of Solr's _default configset:
// a value that does not parse as the suffix's type is refused with 400, as
// Solr does ("Error adding field").
var dynamicTypes = []struct {
	suffix string
	ok     func(any) bool
}{
	{"_dt", func(v any) bool { s, ok := v.(string); _, err := time.Parse(time.RFC3339, s); return ok && err == nil }},
	{"_i", isInteger}, {"_l", isInteger},
	{"_f", isNumber}, {"_d", isNumber},
	{"_b", func(v any) bool { _, ok := v.(bool); return ok }},
}

func isNumber(v any) bool {
	switch x := v.(type) {
	case float64, json.Number:
		return true
	case string:
		_, err := strconv.ParseFloat(x, 64)
		return err == nil
	}
	return false
}

func isInteger(v any) bool {
	switch x := v.(type) {
	case float64:
		return x == float64(int64(x))
	case json.Number:
		_, err := x.Int64()
		return err == nil
	case string:
		_, err := strconv.ParseInt(x, 10, 64)
		return err == nil
	}
	return false
}

// checkDynamicFields returns Solr's error for the first field whose value
// does not fit its dynamic-field type, or "".
func checkDynamicFields(id string, d doc) string {
	for name, v := range d {
		for _, dt := range dynamicTypes {
			if !strings.HasSuffix(name, dt.suffix) {
				continue
			}
			vals, multi := v.([]any)
			if !multi {
				vals = []any{v}
			}
			for _, one := range vals {
				if !dt.ok(one) {
					return fmt.Sprintf("ERROR: [doc=%s] Error adding field '%s'='%v' msg=For input string: \"%v\"", id, name, one, one)
				}
			}
			break
		}
	}
	return ""
}

// checkFieldNames returns the error for the first field name (in name
// order) that Solr's reference guide ("Fields") does not let a document
// use, or "": names consist of ASCII letters, digits and underscores and do
// not start with a digit; names with both leading and trailing underscores
// are reserved, and the only one a document may carry is _version_
// (optimistic concurrency). _childDocuments_ is where Solr reads child
// documents: it must hold documents, and the emulator stores none, so it is
// refused either way, as a plain value is by Solr.
func checkFieldNames(id string, d doc) string {
	names := make([]string, 0, len(d))
	for name := range d {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		switch {
		case name == "_version_":
		case name == "_childDocuments_":
			return fmt.Sprintf("ERROR: [doc=%s] _childDocuments_ holds child documents (a JSON object or an array of them); child documents are not emulated", id)
		case len(name) > 0 && name[0] == '_' && name[len(name)-1] == '_':
			return fmt.Sprintf("ERROR: [doc=%s] field name '%s' is reserved (leading and trailing underscores)", id, name)
		case !validName(name):
			return fmt.Sprintf("ERROR: [doc=%s] invalid field name '%s': field names consist of alphanumeric or underscore characters only and do not start with a digit", id, name)
		}
	}
	return ""
}

// validName reports whether name consists of ASCII letters, digits and
// underscores and does not start with a digit.
func validName(name string) bool {
	if name == "" || ('0' <= name[0] && name[0] <= '9') {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
