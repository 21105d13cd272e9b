package solrtest

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/adapters/internal/loopback"
)

// CoreDefault is the core created when Options.Cores is empty.
const CoreDefault = "records"

// MaxBodyBytes is the largest update body accepted (Solr's default
// formdataUploadLimitInKB is 2 MiB for forms; JSON streams are larger, we cap
// at 32 MiB).
const MaxBodyBytes = 32 << 20

// Options configure a Server. The zero value is usable.
type Options struct {
	// Username and Password enable basic authentication (Solr's
	// BasicAuthPlugin with blockUnknown=true): every request must carry them
	// or is answered 401. Default: no authentication.
	Username string
	Password string
	// Cores are the cores that exist. Default [CoreDefault].
	Cores []string
	// Clock is the emulator's notion of now (commitWithin deadlines, the call
	// log). Default time.Now.
	Clock func() time.Time
}

// Server is a running Solr emulator. Create it with New.
type Server struct {
	opts Options
	ts   *loopback.Server

	mu      sync.Mutex
	changed chan struct{}
	cores   map[string]*core
	version int64
	faults  []*faultState
	calls   []Call
}

// doc is one stored document with its _version_.
type doc map[string]any

// pendingOp is an update not yet visible to searches.
type pendingOp struct {
	due     time.Time // zero: only an explicit commit makes it visible
	id      string
	doc     doc // nil: delete
	replace bool
}

type core struct {
	live    map[string][]doc // real-time view (/get); more than one only with overwrite=false
	index   map[string][]doc // what searches see (committed)
	order   []string         // ids in first-insertion order
	pending []pendingOp
	commits int
}

// New starts an emulator on a loopback port.
func New(opts Options) *Server {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if len(opts.Cores) == 0 {
		opts.Cores = []string{CoreDefault}
	}
	s := &Server{opts: opts, changed: make(chan struct{}), cores: map[string]*core{}}
	s.version = opts.Clock().UnixNano() >> 4
	for _, c := range opts.Cores {
		s.cores[c] = &core{live: map[string][]doc{}, index: map[string][]doc{}}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /solr/{core}/update", s.handleUpdate)
	mux.HandleFunc("POST /solr/{core}/update/json", s.handleUpdate)
	mux.HandleFunc("GET /solr/{core}/get", s.handleGet)
	mux.HandleFunc("GET /solr/{core}/select", s.handleSelect)
	mux.HandleFunc("POST /solr/{core}/select", s.handleSelect)
	s.ts = loopback.Start(s.middleware(mux))
	return s
}

// URL is the Solr base URL including /solr (SOLR_BASE_URL).
func (s *Server) URL() string { return s.ts.URL + "/solr" }

// Close shuts the emulator down.
func (s *Server) Close() { s.ts.Close() }

// notifyLocked wakes Wait callers; s.mu must be held.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// solrError answers Solr's error shape.
func solrError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{
		"responseHeader": map[string]any{"status": status, "QTime": 0},
		"error": map[string]any{
			"metadata": []string{"error-class", "org.apache.solr.common.SolrException",
				"root-error-class", "org.apache.solr.common.SolrException"},
			"msg":  msg,
			"code": status,
		},
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json;charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// statusRecorder captures the status for the call log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// middleware authenticates, logs the call and applies faults.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call := Call{At: s.opts.Clock(), Method: r.Method, Path: r.URL.Path, Handler: handlerOf(r.URL.Path)}
		idx := s.beginCall(call)
		r = r.WithContext(context.WithValue(r.Context(), callKey{}, idx))
		rec := &statusRecorder{ResponseWriter: w}
		fault := s.serve(rec, r, next)
		status := rec.status
		if fault == FaultLoseResponse {
			status = 0
		}
		s.endCall(idx, status, fault)
	})
}

func (s *Server) serve(w *statusRecorder, r *http.Request, next http.Handler) FaultKind {
	if s.opts.Username != "" {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(s.opts.Username)) != 1 ||
			subtle.ConstantTimeCompare([]byte(p), []byte(s.opts.Password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="solr", xBasic`)
			solrError(w, http.StatusUnauthorized, "require authentication")
			return 0
		}
	}
	f := s.takeFault(r.Method, handlerOf(r.URL.Path))
	if f == nil {
		next.ServeHTTP(w, r)
		return 0
	}
	switch f.Kind {
	case FaultStatus:
		status := f.Status
		if status == 0 {
			status = http.StatusServiceUnavailable
		}
		if f.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(f.RetryAfter/time.Second)))
		}
		solrError(w, status, "injected fault")
	case FaultDelay:
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		select {
		case <-t.C:
			next.ServeHTTP(w, r)
		case <-r.Context().Done():
		}
	case FaultLoseResponse:
		// Process the request, then drop the connection without answering.
		next.ServeHTTP(&discard{header: http.Header{}}, r)
		if hj, ok := w.ResponseWriter.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
			}
		}
	}
	return f.Kind
}

// discard is a ResponseWriter that throws the response away.
type discard struct{ header http.Header }

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

func handlerOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) >= 3 {
		return strings.Join(parts[2:], "/")
	}
	return ""
}

func (s *Server) coreOf(w http.ResponseWriter, r *http.Request) *core {
	s.mu.Lock()
	c := s.cores[r.PathValue("core")]
	s.mu.Unlock()
	if c == nil {
		solrError(w, http.StatusNotFound, "Not Found: no core "+strconv.Quote(r.PathValue("core")))
	}
	return c
}

// nextVersionLocked returns a new, strictly increasing _version_.
func (s *Server) nextVersionLocked() int64 {
	s.version++
	return s.version
}

// applyDueLocked makes pending updates whose commitWithin passed visible.
func (s *Server) applyDueLocked(c *core, all bool) {
	now := s.opts.Clock()
	keep := c.pending[:0]
	for _, op := range c.pending {
		if all || (!op.due.IsZero() && !now.Before(op.due)) {
			switch {
			case op.doc == nil:
				delete(c.index, op.id)
			case op.replace:
				c.index[op.id] = []doc{op.doc}
			default:
				c.index[op.id] = append(c.index[op.id], op.doc)
			}
			continue
		}
		keep = append(keep, op)
	}
	c.pending = keep
	if all {
		c.commits++
	}
}
