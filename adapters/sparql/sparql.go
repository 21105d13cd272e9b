package sparql

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/internal/httpout"
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
	xsdDecimal = "http://www.w3.org/2001/XMLSchema#decimal"
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
	// GraphStoreURL, when set, is a SPARQL 1.1 Graph Store HTTP Protocol
	// endpoint (GRAPHDB_GRAPH_STORE_URL), e.g. GraphDB's and RDF4J's
	// {BaseURL}/repositories/{RepositoryID}/rdf-graphs/service or
	// Virtuoso's /sparql-graph-crud: each record's graph is replaced by a
	// PUT of N-Triples instead of a SPARQL Update. Default: unset (SPARQL
	// Update to Endpoint()).
	GraphStoreURL string
}

// Endpoint returns the update URL: UpdateURL, or GraphDB's statements
// endpoint built from BaseURL and RepositoryID.
func (c Config) Endpoint() string {
	if c.UpdateURL != "" {
		return c.UpdateURL
	}
	return strings.TrimRight(c.BaseURL, "/") + "/repositories/" + url.PathEscape(c.RepositoryID) + "/statements"
}

// Validate names the first missing or invalid setting by its Go field, e.g.
// "sparql: Config.RepositoryID is empty (or set Config.UpdateURL)" (an
// application that reads the settings from elsewhere, such as the
// environment, renames the fields in its own messages).
func (c Config) Validate() error {
	if c.UpdateURL == "" {
		if strings.TrimSpace(c.BaseURL) == "" {
			return errors.New("sparql: Config.BaseURL is empty (or set Config.UpdateURL)")
		}
		if strings.TrimSpace(c.RepositoryID) == "" {
			return errors.New("sparql: Config.RepositoryID is empty (or set Config.UpdateURL)")
		}
	}
	if p := httpout.URLProblem(c.Endpoint()); p != "" {
		return errors.New("sparql: the update URL (Config.UpdateURL or Config.BaseURL) " + p)
	}
	if c.GraphStoreURL != "" {
		if p := httpout.URLProblem(c.GraphStoreURL); p != "" {
			return errors.New("sparql: Config.GraphStoreURL " + p)
		}
	}
	if c.Password != "" && c.Username == "" {
		return errors.New("sparql: Config.Password is set but Config.Username is empty")
	}
	for _, p := range []struct{ field, prefix string }{{"GraphPrefix", c.GraphPrefix}, {"FieldPrefix", c.FieldPrefix}} {
		if i := strings.IndexFunc(p.prefix, func(r rune) bool { return r <= 0x20 || strings.ContainsRune(`<>"{}|^`+"`\\", r) }); i >= 0 {
			return fmt.Errorf("sparql: Config.%s %q holds %q, which an IRI may not", p.field, p.prefix, p.prefix[i:i+1])
		}
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
		return nil, err
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
	hc := httpout.Client(cfg.HTTPClient, cfg.Timeout)
	return &Client{cfg: cfg, http: hc, endpoint: cfg.Endpoint()}, nil
}

// GraphIRI is the named graph of a record: the prefix and the id,
// percent-encoded (every byte but ASCII letters, digits and -._~).
func (c *Client) GraphIRI(id string) string { return c.cfg.GraphPrefix + escapeIRI(id) }

// Update returns the SPARQL 1.1 Update that replaces the record's graph:
// DROP SILENT GRAPH <g> ; INSERT DATA { GRAPH <g> { … } }. Its string
// literals read the same whether or not the parser expands codepoint
// escapes before parsing (see sparqlQuote).
func (c *Client) Update(doc Document) string {
	g := c.GraphIRI(doc.ID)
	var b strings.Builder
	fmt.Fprintf(&b, "DROP SILENT GRAPH <%s> ;\nINSERT DATA { GRAPH <%s> {\n", g, g)
	for _, t := range c.triples(doc) {
		fmt.Fprintf(&b, "  <%s> <%s> %s .\n", g, t.pred, t.obj.render(sparqlQuote))
	}
	b.WriteString("} }")
	return b.String()
}

// NTriples returns the record's graph as N-Triples (RDF 1.1), the body of
// the Graph Store Protocol PUT that replaces it (Config.GraphStoreURL).
func (c *Client) NTriples(doc Document) string {
	g := c.GraphIRI(doc.ID)
	var b strings.Builder
	for _, t := range c.triples(doc) {
		fmt.Fprintf(&b, "<%s> <%s> %s .\n", g, t.pred, t.obj.render(ntQuote))
	}
	return b.String()
}

// triple is one triple of a record's graph (the subject is the graph IRI).
type triple struct {
	pred string
	obj  term
}

// term is a literal: a lexical form and a datatype ("" for xsd:string).
type term struct{ lex, datatype string }

func (t term) render(quote func(string) string) string {
	if t.datatype == "" {
		return quote(t.lex)
	}
	return quote(t.lex) + "^^<" + t.datatype + ">"
}

// triples lists the record's triples: version, source hash, then the
// fields in name order.
func (c *Client) triples(doc Document) []triple {
	out := []triple{
		{VersionPredicate, term{strconv.FormatInt(doc.Version, 10), xsdInteger}},
		{HashPredicate, term{doc.SourceHash, ""}},
	}
	keys := make([]string, 0, len(doc.Fields))
	for k := range doc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		pred := c.cfg.FieldPrefix + escapeIRI(k)
		v := doc.Fields[k]
		if arr, ok := v.([]any); ok {
			for _, e := range arr {
				if lit, ok := literal(e); ok {
					out = append(out, triple{pred, lit})
				}
			}
			continue
		}
		if lit, ok := literal(v); ok {
			out = append(out, triple{pred, lit})
		}
	}
	return out
}

// Upsert replaces the record's named graph in one request, so the store
// never holds a half-written record and a replay leaves exactly one graph.
// By default it is sent as an application/x-www-form-urlencoded "update"
// parameter (SPARQL 1.1 Protocol), which GraphDB, RDF4J, Virtuoso, Fuseki
// and Oxigraph accept; with Config.GraphStoreURL it is a Graph Store
// Protocol PUT {GraphStoreURL}?graph={g} of the graph as N-Triples, which
// replaces the graph as a whole.
//
// Errors are classified for the outbox: 5xx, 429, 408 and transport errors
// are retries (429/503 honour Retry-After); any other 4xx is permanent. Error
// text never carries the password.
func (c *Client) Upsert(ctx context.Context, doc Document) error {
	if doc.ID == "" {
		return pgoutbox.Permanent(errors.New("sparql: document has no id"))
	}
	var req *http.Request
	var err error
	if c.cfg.GraphStoreURL != "" {
		u := c.cfg.GraphStoreURL + "?" + url.Values{"graph": {c.GraphIRI(doc.ID)}}.Encode()
		if strings.Contains(c.cfg.GraphStoreURL, "?") {
			u = c.cfg.GraphStoreURL + "&" + url.Values{"graph": {c.GraphIRI(doc.ID)}}.Encode()
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodPut, u, strings.NewReader(c.NTriples(doc)))
		if err == nil {
			req.Header.Set("Content-Type", "application/n-triples; charset=utf-8")
		}
	} else {
		form := url.Values{"update": {c.Update(doc)}}
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, strings.NewReader(form.Encode()))
		if err == nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	}
	if err != nil {
		return pgoutbox.Permanent(fmt.Errorf("sparql: %w", err))
	}
	req.Header.Set("Accept", "*/*")
	if c.cfg.Username != "" {
		req.SetBasicAuth(c.cfg.Username, c.cfg.Password)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return httpout.TransportError("sparql", req, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		_ = httpout.ErrorBody(resp) // drain a short answer so the connection is reused
		return nil
	}
	msg := httpout.Excerpt(strings.TrimSpace(string(httpout.ErrorBody(resp))), 300)
	return httpout.Outcome(resp, fmt.Errorf("sparql: update: HTTP %d: %s", resp.StatusCode, msg))
}

// Exact numbers. Every number is written so that its value survives
// exactly in any SPARQL 1.1 store, including Virtuoso 7, whose xsd:integer
// is 64-bit (it wraps a larger one silently) and whose xsd:decimal holds
// MaxDecimalDigits digits with at most MaxFractionDigits after the point (it
// rounds a longer one silently).
const (
	// MaxDecimalDigits is the most digits of a number written as
	// xsd:decimal.
	MaxDecimalDigits = 40
	// MaxFractionDigits is the most digits after the point of a number
	// written as xsd:decimal.
	MaxFractionDigits = 15
)

// literal renders a JSON value as an RDF literal; null is skipped, objects
// and arrays become rdf:JSON literals, strings plain literals, booleans
// xsd:boolean, and numbers (json.Number, text as written) are exact:
//
//   - an integer within int64 is xsd:integer, as written;
//   - any other number whose exact decimal value has at most
//     MaxDecimalDigits digits, MaxFractionDigits of them after the point, is
//     xsd:decimal: as written without an exponent (an integer beyond int64
//     too: "18446744073709551616"^^xsd:decimal is the same value), in exact
//     decimal notation with one (1.5e3 → "1500.0");
//   - a number beyond that is a plain literal holding its text as written,
//     never a rounded value (xsd:double is never used).
func literal(v any) (term, bool) {
	switch x := v.(type) {
	case nil:
		return term{}, false
	case string:
		return term{x, ""}, true
	case bool:
		return term{strconv.FormatBool(x), xsdBoolean}, true
	case json.Number:
		return number(string(x)), true
	case float64:
		return number(strconv.FormatFloat(x, 'g', -1, 64)), true
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return term{}, false
		}
		return term{string(b), rdfJSON}, true
	}
}

// number renders a JSON number's text exactly (see literal).
func number(lex string) term {
	text := term{lex, ""}
	mant, exp, hasExp := strings.Cut(strings.ToLower(lex), "e")
	intPart, frac, hasDot := strings.Cut(mant, ".")
	neg := strings.HasPrefix(intPart, "-")
	intPart = strings.TrimPrefix(intPart, "-")
	if !digits(intPart) || (hasDot && !digits(frac)) {
		return text // not a JSON number: keep the text
	}
	if !hasExp && !hasDot {
		if _, err := strconv.ParseInt(lex, 10, 64); err == nil {
			return term{lex, xsdInteger}
		}
	}
	e := 0
	if hasExp {
		n, err := strconv.Atoi(exp)
		if err != nil || n > MaxDecimalDigits || n < -MaxDecimalDigits-MaxFractionDigits {
			return text
		}
		e = n
	}
	// The value is the digits intPart+frac with the point after
	// len(intPart)+e of them.
	all := intPart + frac
	point := len(intPart) + e
	switch {
	case point <= 0:
		all, point = strings.Repeat("0", 1-point)+all, 1
	case point > len(all):
		all += strings.Repeat("0", point-len(all))
	}
	ip, fp := strings.TrimLeft(all[:point], "0"), strings.TrimRight(all[point:], "0")
	if len(fp) > MaxFractionDigits || len(ip)+len(fp) > MaxDecimalDigits {
		return text
	}
	if !hasExp {
		return term{lex, xsdDecimal}
	}
	if ip == "" {
		ip = "0"
	}
	if fp == "" {
		fp = "0"
	}
	if neg {
		ip = "-" + ip
	}
	return term{ip + "." + fp, xsdDecimal}
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// sparqlQuote renders a SPARQL 1.1 string literal that reads as
// exactly s whether or not the parser expands codepoint escapes (\uXXXX,
// \UXXXXXXXX) in the whole text before parsing, as SPARQL 1.1 §19.2 allows:
//
//   - " and \ are written \" and \\; \n, \r, \t, \b and \f as those
//     escapes;
//   - a u or U that follows a backslash of s is written \U00000075 or
//     \U00000055, so the text never holds a backslash followed by u or U
//     that an expanding parser would take for an escape;
//   - other control characters (U+0001–U+001F, U+007F) are written
//     \U000000XX: always eight digits, so an expanding parser that accepts
//     four or eight hex digits after \u or \U cannot take the characters
//     that follow as part of the escape.
//
// Every other character is written as itself (UTF-8).
func sparqlQuote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	afterBackslash := false
	for _, r := range s {
		if afterBackslash && (r == 'u' || r == 'U') {
			fmt.Fprintf(&b, `\U%08X`, r)
			afterBackslash = false
			continue
		}
		afterBackslash = r == '\\'
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
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 || r == 0x7f {
				fmt.Fprintf(&b, `\U%08X`, r)
				continue
			}
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// ntQuote renders an N-Triples string literal that reads as exactly s:
// " as \", \n, \r and \t as those escapes, a backslash of s as \u005C
// (so that no parser, even one that expands \u escapes again after the
// other escapes, can take it and the characters after it for an escape),
// other control characters as \u00XX, everything else as itself (UTF-8).
func ntQuote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\u005C`)
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
