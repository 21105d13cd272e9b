package githubtest

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	perPageDefault = 30
	perPageMax     = 100
)

// SearchLimit is the most workflow runs a filtered listing returns (see
// listWorkflowRuns); pages past it are empty.
const SearchLimit = 1000

// pagination reads page and per_page as GitHub does: defaults 1 and 30,
// per_page capped at 100, unparsable values ignored.
func pagination(q url.Values) (page, perPage int) {
	page, perPage = 1, perPageDefault
	if v, err := strconv.Atoi(q.Get("page")); err == nil && v > 0 {
		page = v
	}
	if v, err := strconv.Atoi(q.Get("per_page")); err == nil && v > 0 {
		perPage = min(v, perPageMax)
	}
	return page, perPage
}

func paginate[T any](items []T, page, perPage int) []T {
	start := (page - 1) * perPage
	if start >= len(items) {
		return nil
	}
	return items[start:min(start+perPage, len(items))]
}

// linkHeader builds GitHub's Link header (first, prev, next, last) for a
// paginated list, or nil when everything fits on one page.
func linkHeader(r *http.Request, page, perPage, total int) http.Header {
	last := max((total+perPage-1)/perPage, 1)
	if last == 1 && page == 1 {
		return nil
	}
	link := func(p int, rel string) string {
		q := r.URL.Query()
		q.Set("per_page", strconv.Itoa(perPage))
		q.Set("page", strconv.Itoa(p))
		return fmt.Sprintf(`<%s%s?%s>; rel="%s"`, apiBase(r), r.URL.Path, q.Encode(), rel)
	}
	var parts []string
	if page > 1 {
		parts = append(parts, link(page-1, "prev"))
	}
	if page < last {
		parts = append(parts, link(page+1, "next"), link(last, "last"))
	}
	if page > 1 {
		parts = append(parts, link(1, "first"))
	}
	return http.Header{"Link": {strings.Join(parts, ", ")}}
}

// dateRange is a parsed "created" filter (GitHub's search date syntax):
// a half-open or closed interval, unbounded where from/to are zero.
type dateRange struct {
	from, to       time.Time
	fromExclusive  bool
	toExclusive    bool
	constrained    bool
	fromSet, toSet bool
}

func (d dateRange) contains(t time.Time) bool {
	if !d.constrained {
		return true
	}
	if d.fromSet && (t.Before(d.from) || (d.fromExclusive && t.Equal(d.from))) {
		return false
	}
	if d.toSet && (t.After(d.to) || (d.toExclusive && t.Equal(d.to))) {
		return false
	}
	return true
}

// parseDateRange parses "", ">=X", ">X", "<=X", "<X", "X..Y" (either side
// may be "*") and "X", where X is a date (YYYY-MM-DD, a whole day) or a
// date-time (RFC 3339, or without zone meaning UTC).
func parseDateRange(v string) (dateRange, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return dateRange{}, nil
	}
	d := dateRange{constrained: true}
	lower := func(s string, exclusive bool) error {
		t, day, err := parseDate(s)
		if err != nil {
			return err
		}
		if day && exclusive {
			t, exclusive = t.Add(24*time.Hour), false
		}
		d.from, d.fromExclusive, d.fromSet = t, exclusive, true
		return nil
	}
	upper := func(s string, exclusive bool) error {
		t, day, err := parseDate(s)
		if err != nil {
			return err
		}
		if day && !exclusive {
			t, exclusive = t.Add(24*time.Hour), true
		}
		d.to, d.toExclusive, d.toSet = t, exclusive, true
		return nil
	}
	var err error
	switch {
	case strings.HasPrefix(v, ">="):
		err = lower(v[2:], false)
	case strings.HasPrefix(v, ">"):
		err = lower(v[1:], true)
	case strings.HasPrefix(v, "<="):
		err = upper(v[2:], false)
	case strings.HasPrefix(v, "<"):
		err = upper(v[1:], true)
	case strings.Contains(v, ".."):
		a, b, _ := strings.Cut(v, "..")
		if a != "*" {
			err = lower(a, false)
		}
		if err == nil && b != "*" {
			err = upper(b, false)
		}
	default:
		if err = lower(v, false); err == nil {
			err = upper(v, false)
		}
	}
	return d, err
}

// parseDate reports whether s was a bare date.
func parseDate(s string) (t time.Time, day bool, err error) {
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, true, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, false, nil
		}
	}
	return time.Time{}, false, errors.New("invalid date")
}
