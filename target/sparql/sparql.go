package sparql

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// Defaults of Config.
const (
	// GraphPrefixDefault prefixes the named graph (and subject) IRI of a
	// record; the record id follows, percent-encoded (GRAPHDB_GRAPH_PREFIX).
	GraphPrefixDefault = "urn:pgoutbox:record:"
	// FieldPrefixDefault prefixes the predicate IRI of each record field.
	FieldPrefixDefault = "urn:pgoutbox:field:"
	// TimeoutDefault bounds one request; it must stay below the projection's
	// lease.
	TimeoutDefault = 10 * time.Second
	// maxErrorBody bounds how much of an error response is read.
	maxErrorBody = 4 << 10
)

// Predicates of the bookkeeping triples written for every record.
const (
	// VersionPredicate holds the record version the graph was projected from.
	VersionPredicate = "urn:pgoutbox:meta:version"
	// HashPredicate holds the record's source hash.
	HashPredicate = "urn:pgoutbox:meta:sourceHash"
)

// XSD and RDF datatypes used for literals.
const (
	xsdInteger = "http://www.w3.org/2001/XMLSchema#integer"
	xsdDouble  = "http://www.w3.org/2001/XMLSchema#double"
	xsdBoolean = "http://www.w3.org/2001/XMLSchema#boolean"
	rdfJSON    = "http://www.w3.org/1999/02/22-rdf-syntax-ns#JSON"
)

// Config configures a Client.
type Config struct {
	// UpdateURL is the SPARQL 1.1 Update endpoint (GRAPHDB_UPDATE_URL). Default
	// GraphDB's {BaseURL}/repositories/{RepositoryID}/statements; set it for
	// any other SPARQL 1.1 store (e.g. Virtuoso's /sparql).
	UpdateURL string
	// BaseURL is GraphDB's base URL, e.g. http://127.0.0.1:7200
	// (GRAPHDB_BASE_URL). Required unless UpdateURL is set.
	BaseURL string
	// RepositoryID is the GraphDB repository (GRAPHDB_REPOSITORY_ID).
	// Required unless UpdateURL is set.
	RepositoryID string
	// Username and Password are sent as HTTP basic auth when Username is set
	// (GRAPHDB_USERNAME, GRAPHDB_PASSWORD). Default: no authentication.
	Username string
	Password string
	// GraphPrefix prefixes each record's graph IRI (GRAPHDB_GRAPH_PREFIX);
	// default GraphPrefixDefault.
	GraphPrefix string
	// FieldPrefix prefixes each field's predicate IRI; default
	// FieldPrefixDefault.
	FieldPrefix string
	// Timeout bounds one request; default TimeoutDefault (10 s).
	Timeout time.Duration
	// HTTPClient sends the requests; default a client with Timeout.
	HTTPClient *http.Client
}

// Endpoint returns the update URL: UpdateURL, or GraphDB's statements
// endpoint built from BaseURL and RepositoryID.
func (c Config) Endpoint() string {
	if c.UpdateURL != "" {
		return c.UpdateURL
	}
	return strings.TrimRight(c.BaseURL, "/") + "/repositories/" + url.PathEscape(c.RepositoryID) + "/statements"
}

// Validate names the first missing or invalid setting.
func (c Config) Validate() error {
	if c.UpdateURL == "" {
		if strings.TrimSpace(c.BaseURL) == "" {
			return errors.New("GRAPHDB_BASE_URL is not set (or set GRAPHDB_UPDATE_URL)")
		}
		if strings.TrimSpace(c.RepositoryID) == "" {
			return errors.New("GRAPHDB_REPOSITORY_ID is not set (or set GRAPHDB_UPDATE_URL)")
		}
	}
	u, err := url.Parse(c.Endpoint())
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("the SPARQL update URL (GRAPHDB_UPDATE_URL or GRAPHDB_BASE_URL) is not an http(s) URL")
	}
	if u.User != nil {
		return errors.New("the SPARQL update URL must not carry credentials: set GRAPHDB_USERNAME and GRAPHDB_PASSWORD")
	}
	if c.Password != "" && c.Username == "" {
		return errors.New("GRAPHDB_PASSWORD is set but GRAPHDB_USERNAME is not")
	}
	return nil
}

// Document is one record to project.
type Document struct {
	// ID is the record id.
	ID string
	// Version is the record version.
	Version int64
	// SourceHash is the record's source hash.
	SourceHash string
	// Fields are the record's top-level fields (from encoding/json with
	// UseNumber).
	Fields map[string]any
}

// Client replaces one named graph per record in a SPARQL 1.1 store.
type Client struct {
	cfg      Config
	http     *http.Client
	endpoint string
}

// New validates cfg and returns a Client.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sparql: %w", err)
	}
	if cfg.GraphPrefix == "" {
		cfg.GraphPrefix = GraphPrefixDefault
	}
	if cfg.FieldPrefix == "" {
		cfg.FieldPrefix = FieldPrefixDefault
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = TimeoutDefault
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: cfg.Timeout}
	}
	return &Client{cfg: cfg, http: hc, endpoint: cfg.Endpoint()}, nil
}

// GraphIRI is the named graph of a record: the prefix and the id,
// percent-encoded (every byte but ASCII letters, digits and -._~).
func (c *Client) GraphIRI(id string) string { return c.cfg.GraphPrefix + escapeIRI(id) }

// Update returns the SPARQL 1.1 Update that replaces the record's graph:
// DROP SILENT GRAPH <g> ; INSERT DATA { GRAPH <g> { … } }.
func (c *Client) Update(doc Document) string {
	g := c.GraphIRI(doc.ID)
	var b strings.Builder
	fmt.Fprintf(&b, "DROP SILENT GRAPH <%s> ;\nINSERT DATA { GRAPH <%s> {\n", g, g)
	subj := "<" + g + ">"
	fmt.Fprintf(&b, "  %s <%s> %s .\n", subj, VersionPredicate, typed(strconv.FormatInt(doc.Version, 10), xsdInteger))
	fmt.Fprintf(&b, "  %s <%s> %s .\n", subj, HashPredicate, quote(doc.SourceHash))
	keys := make([]string, 0, len(doc.Fields))
	for k := range doc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		pred := "<" + c.cfg.FieldPrefix + escapeIRI(k) + ">"
		v := doc.Fields[k]
		if arr, ok := v.([]any); ok {
			for _, e := range arr {
				if lit, ok := literal(e); ok {
					fmt.Fprintf(&b, "  %s %s %s .\n", subj, pred, lit)
				}
			}
			continue
		}
		if lit, ok := literal(v); ok {
			fmt.Fprintf(&b, "  %s %s %s .\n", subj, pred, lit)
		}
	}
	b.WriteString("} }")
	return b.String()
}

// Upsert replaces the record's named graph in one request, so the store
// never holds a half-written record and a replay leaves exactly one graph.
// It is sent as an application/x-www-form-urlencoded "update" parameter
// (SPARQL 1.1 Protocol), which GraphDB, RDF4J, Virtuoso, Fuseki and
// Oxigraph accept.
//
// Errors are classified for the outbox: 5xx, 429, 408 and transport errors
// are retries (429/503 honour Retry-After); any other 4xx is permanent. Error
// text never carries the password.
func (c *Client) Upsert(ctx context.Context, doc Document) error {
	if doc.ID == "" {
		return pgoutbox.Permanent(errors.New("sparql: document has no id"))
	}
	form := url.Values{"update": {c.Update(doc)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return pgoutbox.Permanent(fmt.Errorf("sparql: %w", err))
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "*/*")
	if c.cfg.Username != "" {
		req.SetBasicAuth(c.cfg.Username, c.cfg.Password)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return pgoutbox.Ambiguous(fmt.Errorf("sparql: POST %s: %w", req.URL.Path, err))
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg := strings.TrimSpace(string(b))
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	herr := fmt.Errorf("sparql: update: HTTP %d: %s", resp.StatusCode, msg)
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s >= 0 {
			return pgoutbox.RetryAfter(time.Duration(s)*time.Second, herr)
		}
		return pgoutbox.Retry(herr)
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout:
		return pgoutbox.Retry(herr)
	default:
		return pgoutbox.Permanent(herr)
	}
}

// literal renders a JSON value as an RDF literal; null is skipped, objects
// and arrays become rdf:JSON literals.
func literal(v any) (string, bool) {
	switch x := v.(type) {
	case nil:
		return "", false
	case string:
		return quote(x), true
	case bool:
		return typed(strconv.FormatBool(x), xsdBoolean), true
	case json.Number:
		if _, err := x.Int64(); err == nil {
			return typed(x.String(), xsdInteger), true
		}
		if f, err := x.Float64(); err == nil {
			return typed(strconv.FormatFloat(f, 'E', -1, 64), xsdDouble), true
		}
		return quote(x.String()), true
	case float64:
		return typed(strconv.FormatFloat(x, 'E', -1, 64), xsdDouble), true
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return "", false
		}
		return typed(string(b), rdfJSON), true
	}
}

func typed(lex, datatype string) string { return quote(lex) + "^^<" + datatype + ">" }

// quote renders a SPARQL string literal with every character that needs it
// escaped.
func quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 || r == 0x7f {
				fmt.Fprintf(&b, `\u%04X`, r)
				continue
			}
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// escapeIRI percent-encodes every byte but ASCII letters, digits and -._~,
// which is always a valid IRI path segment.
func escapeIRI(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}
