package solr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/internal/httpout"
)

// Defaults of Config.
const (
	// CommitWithinDefault is the commitWithin sent with every add
	// (SOLR_COMMIT_WITHIN_MS): the document is searchable at most this long
	// after the add, without an explicit commit.
	CommitWithinDefault = time.Second
	// TimeoutDefault bounds one HTTP request; it must stay below the
	// projection's lease.
	TimeoutDefault = 10 * time.Second
	// ConflictRetries is how many times an add that lost an optimistic
	// concurrency race (409) is re-read and re-sent before the delivery is
	// retried later.
	ConflictRetries = 3
	// maxBody bounds how much of a success response is read.
	maxBody = 1 << 20
)

// Fields the handler writes next to the record's own fields (dynamic-field
// suffixes of Solr's default configset: _l long, _s string).
const (
	// VersionField holds the record version the document was projected from.
	VersionField = "pgoutbox_version_l"
	// HashField holds the record's source hash.
	HashField = "pgoutbox_source_hash_s"
)

// Config configures a Client.
type Config struct {
	// BaseURL is Solr's base URL including the /solr path, e.g.
	// http://127.0.0.1:8983/solr (SOLR_BASE_URL). Required. It must not carry
	// credentials: use Username and Password.
	BaseURL string
	// Core is the core or collection name (SOLR_CORE). Required.
	Core string
	// Username and Password are sent as HTTP basic auth when Username is set
	// (SOLR_USERNAME, SOLR_PASSWORD). Default: no authentication.
	Username string
	Password string
	// CommitWithin is sent with every add (SOLR_COMMIT_WITHIN_MS); default
	// CommitWithinDefault (1 s).
	CommitWithin time.Duration
	// Timeout bounds one request; default TimeoutDefault (10 s).
	Timeout time.Duration
	// HTTPClient sends the requests; default a client with Timeout.
	HTTPClient *http.Client
}

// Validate names the first missing or invalid setting by its Go field, e.g.
// "solr: Config.Core is empty" (an application that reads the settings
// from elsewhere, such as the environment, renames the fields in its own
// messages).
func (c Config) Validate() error {
	if strings.TrimSpace(c.BaseURL) == "" {
		return errors.New("solr: Config.BaseURL is empty")
	}
	if p := httpout.URLProblem(c.BaseURL); p != "" {
		return errors.New("solr: Config.BaseURL " + p)
	}
	if strings.TrimSpace(c.Core) == "" {
		return errors.New("solr: Config.Core is empty")
	}
	if c.Password != "" && c.Username == "" {
		return errors.New("solr: Config.Password is set but Config.Username is empty")
	}
	return nil
}

// Document is one record to project.
type Document struct {
	// ID is the record id, Solr's uniqueKey "id".
	ID string
	// Version is the record version (storage_documents.records.version).
	Version int64
	// SourceHash is the record's source hash.
	SourceHash string
	// Fields are the record's top-level fields (from encoding/json with
	// UseNumber). Nested objects, and arrays holding objects, are sent as JSON
	// strings (Solr would read them as child documents); "id" (the record id,
	// sent as the uniqueKey) is not sent again; every other name is sent as
	// FieldName maps it, so no field is dropped and none reaches Solr under a
	// reserved or invalid name.
	Fields map[string]any
}

// Result says what Upsert did.
type Result string

// Upsert results.
const (
	// Written: the document was added or replaced.
	Written Result = "written"
	// AlreadyCurrent: Solr already holds this version; nothing was sent.
	AlreadyCurrent Result = "already_current"
	// SkippedNewer: Solr holds a newer version; nothing was sent, so an
	// out-of-order (older) projection never overwrites a newer one.
	SkippedNewer Result = "skipped_newer"
)

// Client writes records to one Solr core.
type Client struct {
	cfg    Config
	http   *http.Client
	update string
	get    string
}

// New validates cfg and returns a Client.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.CommitWithin <= 0 {
		cfg.CommitWithin = CommitWithinDefault
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = TimeoutDefault
	}
	hc := httpout.Client(cfg.HTTPClient, cfg.Timeout)
	base := strings.TrimRight(cfg.BaseURL, "/") + "/" + url.PathEscape(cfg.Core)
	return &Client{cfg: cfg, http: hc, update: base + "/update", get: base + "/get"}, nil
}

// current is what Solr holds for a document id.
type current struct {
	found       bool
	solrVersion int64
	version     int64
	hash        string
}

// Upsert adds or replaces the document by id with commitWithin, unless Solr
// already holds the same or a newer record version. Out-of-order safety uses
// Solr's optimistic concurrency: the add carries the _version_ read by a
// real-time get (or -1, "must not exist"), so a concurrent writer makes Solr
// answer 409 and Upsert re-reads and decides again.
//
// Errors are classified for the outbox: 5xx, 429, 408, transport errors and
// persistent conflicts are retries (429/503 honour Retry-After); any other
// 4xx is permanent. Error text never carries the password.
func (c *Client) Upsert(ctx context.Context, doc Document) (Result, error) {
	if doc.ID == "" {
		return "", pgoutbox.Permanent(errors.New("solr: document has no id"))
	}
	body := make(map[string]any, len(doc.Fields)+4)
	for k, v := range doc.Fields {
		if k == "id" {
			continue
		}
		body[FieldName(k)] = flatten(v)
	}
	body["id"] = doc.ID
	body[VersionField] = doc.Version
	body[HashField] = doc.SourceHash
	for range ConflictRetries {
		cur, err := c.current(ctx, doc.ID)
		if err != nil {
			return "", err
		}
		switch {
		case cur.found && cur.version > doc.Version:
			return SkippedNewer, nil
		case cur.found && cur.version == doc.Version && cur.hash == doc.SourceHash:
			return AlreadyCurrent, nil
		}
		expect := int64(-1) // must not exist
		if cur.found {
			expect = cur.solrVersion
		}
		body["_version_"] = expect
		conflict, err := c.add(ctx, body)
		if err != nil {
			return "", err
		}
		if !conflict {
			return Written, nil
		}
	}
	return "", pgoutbox.Retry(fmt.Errorf("solr: document %q: version conflict persisted after %d attempts", doc.ID, ConflictRetries))
}

// MappedFieldPrefix starts the Solr name of every record field whose own
// name Solr does not take as is (see FieldName).
const MappedFieldPrefix = "pgoutbox_x_"

// FieldName is the Solr field a record field is written to. Solr's
// reference guide ("Fields"): field names should consist of alphanumeric or
// underscore characters only and not start with a digit, and names with both
// leading and trailing underscores (_version_, _root_, _nest_path_,
// _childDocuments_…) are reserved. A name that follows those rules, and
// does not start with "pgoutbox_" (the handler's own fields,
// VersionField and HashField, live there), is kept as is. Any other name —
// empty, reserved, with another character (a hyphen, a dot, a space,
// non-ASCII), starting with a digit or with "pgoutbox_" — is mapped to
// MappedFieldPrefix followed by the name with every ASCII letter and digit
// kept, "_" written "__" and every other byte "_" and two lowercase hex
// digits: "_childDocuments_" → "pgoutbox_x___childDocuments__",
// "date-created" → "pgoutbox_x_date_2dcreated", "" → "pgoutbox_x_". The
// mapping is deterministic and one-to-one (a kept name never starts with
// "pgoutbox_"; the escaping decodes uniquely), so two record fields never
// share a Solr field.
func FieldName(name string) string {
	if validFieldName(name) && !strings.HasPrefix(name, "pgoutbox_") {
		return name
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.WriteString(MappedFieldPrefix)
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9':
			b.WriteByte(c)
		case c == '_':
			b.WriteString("__")
		default:
			b.WriteByte('_')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// validFieldName reports whether Solr's reference guide lets a document
// use name: ASCII letters, digits and underscores, not starting with a
// digit, and not reserved (leading and trailing underscore).
func validFieldName(name string) bool {
	if name == "" || ('0' <= name[0] && name[0] <= '9') {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return !(name[0] == '_' && name[len(name)-1] == '_')
}

// flatten turns nested objects (and arrays holding objects or arrays) into
// JSON strings.
func flatten(v any) any {
	switch x := v.(type) {
	case map[string]any:
		b, _ := json.Marshal(x)
		return string(b)
	case []any:
		for _, e := range x {
			switch e.(type) {
			case map[string]any, []any:
				b, _ := json.Marshal(x)
				return string(b)
			}
		}
	}
	return v
}

func (c *Client) current(ctx context.Context, id string) (current, error) {
	q := url.Values{"id": {id}, "fl": {"id,_version_," + VersionField + "," + HashField}, "wt": {"json"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.get+"?"+q.Encode(), nil)
	if err != nil {
		return current{}, pgoutbox.Permanent(fmt.Errorf("solr: %w", err))
	}
	resp, err := c.do(req)
	if err != nil {
		return current{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return current{}, classify(resp, "real-time get")
	}
	var out struct {
		Doc *struct {
			Version    json.Number `json:"_version_"`
			RecVersion json.Number `json:"pgoutbox_version_l"`
			RecHash    any         `json:"pgoutbox_source_hash_s"`
		} `json:"doc"`
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxBody))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		return current{}, pgoutbox.Retry(fmt.Errorf("solr: real-time get: malformed response: %w", err))
	}
	if out.Doc == nil {
		return current{}, nil
	}
	cur := current{found: true}
	cur.solrVersion, _ = out.Doc.Version.Int64()
	cur.version, _ = out.Doc.RecVersion.Int64()
	switch h := out.Doc.RecHash.(type) {
	case string:
		cur.hash = h
	case []any: // a multiValued string field
		if len(h) > 0 {
			cur.hash, _ = h[0].(string)
		}
	}
	if cur.solrVersion == 0 {
		return current{}, pgoutbox.Retry(errors.New("solr: real-time get: the document has no _version_ (is the update log enabled?)"))
	}
	return cur, nil
}

// add sends one add command; conflict is true on 409.
func (c *Client) add(ctx context.Context, doc map[string]any) (conflict bool, err error) {
	cmd := map[string]any{"add": map[string]any{
		"doc":          doc,
		"overwrite":    true,
		"commitWithin": c.cfg.CommitWithin.Milliseconds(),
	}}
	b, err := json.Marshal(cmd)
	if err != nil {
		return false, pgoutbox.Permanent(fmt.Errorf("solr: encode document: %w", err))
	}
	q := url.Values{"wt": {"json"}, "commitWithin": {strconv.FormatInt(c.cfg.CommitWithin.Milliseconds(), 10)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.update+"?"+q.Encode(), bytes.NewReader(b))
	if err != nil {
		return false, pgoutbox.Permanent(fmt.Errorf("solr: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.do(req)
	if err != nil {
		// The add may have been applied: harmless, it is replay-safe.
		return false, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusConflict:
		_ = httpout.ErrorBody(resp)
		return true, nil
	case resp.StatusCode/100 == 2:
		var out struct {
			ResponseHeader *struct {
				Status int `json:"status"`
			} `json:"responseHeader"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&out); err != nil || out.ResponseHeader == nil {
			return false, pgoutbox.Ambiguous(errors.New("solr: update: malformed 2xx response"))
		}
		if out.ResponseHeader.Status != 0 {
			return false, pgoutbox.Retry(fmt.Errorf("solr: update: responseHeader.status %d", out.ResponseHeader.Status))
		}
		return false, nil
	default:
		return false, classify(resp, "update")
	}
}

func (c *Client) do(req *http.Request) (*http.Response, error) {
	if c.cfg.Username != "" {
		req.SetBasicAuth(c.cfg.Username, c.cfg.Password)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, httpout.TransportError("solr", req, err)
	}
	return resp, nil
}

// classify maps an error status to an outcome (httpout.Outcome: 429 and
// 503 honour Retry-After, other 5xx and 408 retry, the rest is permanent),
// with Solr's error.msg in the text.
func classify(resp *http.Response, op string) error {
	return httpout.Outcome(resp, fmt.Errorf("solr: %s: HTTP %d%s", op, resp.StatusCode, errorMessage(resp)))
}

// errorMessage extracts Solr's error.msg (bounded), if any.
func errorMessage(resp *http.Response) string {
	var out struct {
		Error struct {
			Msg string `json:"msg"`
		} `json:"error"`
	}
	if json.Unmarshal(httpout.ErrorBody(resp), &out) == nil && out.Error.Msg != "" {
		return ": " + httpout.Excerpt(out.Error.Msg, 300)
	}
	return ""
}
