package ops

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Defaults of the status statistics.
const (
	// StalledAfterDefault is the lease age from which a lease counts as
	// stalled (OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES, 10).
	StalledAfterDefault = 10 * time.Minute
	// LagWindowDefault is the window of completions over which lag
	// percentiles and recent completions are computed: CompletedWindow.
	LagWindowDefault = CompletedWindow
)

// Filter narrows an operator command. Empty fields match everything; values
// are compared literally.
type Filter struct {
	// Queue matches one queue exactly.
	Queue string `json:"queue,omitempty"`
	// Type matches one effect type exactly.
	Type string `json:"effect_type,omitempty"`
}

func (f Filter) store() store.OpsFilter { return store.OpsFilter{Queue: f.Queue, Type: f.Type} }

// StatusOptions configures [Status].
type StatusOptions struct {
	// Filter narrows the snapshot (default: every queue and type).
	Filter Filter
	// StalledAfter defaults to StalledAfterDefault.
	StalledAfter time.Duration
	// LagWindow defaults to LagWindowDefault.
	LagWindow time.Duration
}

func (o StatusOptions) withDefaults() StatusOptions {
	if o.StalledAfter <= 0 {
		o.StalledAfter = StalledAfterDefault
	}
	if o.LagWindow <= 0 {
		o.LagWindow = LagWindowDefault
	}
	return o
}

// Counts is the state of one queue, or of one effect type of a queue.
type Counts struct {
	Queue string `json:"queue"`
	// Type is empty on a queue's total.
	Type string `json:"effect_type,omitempty"`
	// Available counts effects waiting for a claim (due or not), retrying
	// ones included: the projection's "pending".
	Available int64 `json:"available"`
	// Retrying counts available effects with attempts > 0.
	Retrying int64 `json:"retrying"`
	// Parked counts available effects parked behind their ordering key's
	// blocked head (docs/design.md, "Per-key ordering"); they are in
	// Available too.
	Parked int64 `json:"parked"`
	Leased int64 `json:"leased"`
	// StalledLeases counts leases taken more than StalledAfter ago.
	StalledLeases          int64 `json:"stalled_leases"`
	DeadLetter             int64 `json:"dead_letter"`
	ReconciliationRequired int64 `json:"reconciliation_required"`
	// CompletedRecent counts effects completed within the lag window.
	CompletedRecent int64 `json:"completed_recent"`
	// OldestAvailableAgeSeconds is now() minus the oldest available_at of a
	// due available effect; 0 when none waits.
	OldestAvailableAgeSeconds float64 `json:"oldest_available_age_seconds"`
	// LagP50Seconds and LagP99Seconds are over the completions within the
	// lag window; absent when there were none.
	LagP50Seconds *float64 `json:"lag_p50_seconds,omitempty"`
	LagP99Seconds *float64 `json:"lag_p99_seconds,omitempty"`
}

func (c *Counts) add(r store.StatsRow) {
	switch r.State {
	case "available":
		c.Available += r.Count
		c.Retrying += r.Retrying
		c.Parked += r.Parked
		c.OldestAvailableAgeSeconds = max(c.OldestAvailableAgeSeconds, r.OldestAvailableAge)
	case "leased":
		c.Leased += r.Count
		c.StalledLeases += r.StalledLeases
	case "dead_letter":
		c.DeadLetter += r.Count
	case "reconciliation_required":
		c.ReconciliationRequired += r.Count
	case "completed":
		c.CompletedRecent += r.Count
		c.LagP50Seconds, c.LagP99Seconds = r.LagP50, r.LagP99
	}
}

// Snapshot is the result of one [Status] run.
type Snapshot struct {
	// TakenAt is the database clock when the snapshot was taken.
	TakenAt             time.Time `json:"taken_at"`
	Filter              Filter    `json:"filter"`
	StalledAfterSeconds float64   `json:"stalled_after_seconds"`
	LagWindowSeconds    float64   `json:"lag_window_seconds"`
	// CompletedWindow names the lag window, as every view shows it
	// (WindowLabel): "completed in the last 5 min" by default.
	CompletedWindow      string  `json:"completed_window"`
	OldestXminAgeSeconds float64 `json:"oldest_xmin_age_seconds"`
	XminHolders          int64   `json:"xmin_holders"`
	// Queues has one entry per queue with effects, by name.
	Queues []Counts `json:"queues"`
	// Types has one entry per queue and effect type (the /metrics series).
	Types []Counts `json:"types"`
	// Paused lists the paused queues (migration 00023), by name, whether
	// they have effects or not; no claim takes their effects.
	Paused []QueuePause `json:"paused"`
}

// PausedQueue returns the pause of queue, or nil.
func (s *Snapshot) PausedQueue(queue string) *QueuePause {
	for i := range s.Paused {
		if s.Paused[i].Queue == queue {
			return &s.Paused[i]
		}
	}
	return nil
}

// Total sums the queues: counts add up, ages take the maximum. Its lag
// percentiles are those of the single queue when there is one, else absent
// (percentiles do not add).
func (s *Snapshot) Total() Counts {
	var t Counts
	for _, q := range s.Queues {
		t.Available += q.Available
		t.Retrying += q.Retrying
		t.Parked += q.Parked
		t.Leased += q.Leased
		t.StalledLeases += q.StalledLeases
		t.DeadLetter += q.DeadLetter
		t.ReconciliationRequired += q.ReconciliationRequired
		t.CompletedRecent += q.CompletedRecent
		t.OldestAvailableAgeSeconds = max(t.OldestAvailableAgeSeconds, q.OldestAvailableAgeSeconds)
	}
	if len(s.Queues) == 1 {
		t.LagP50Seconds, t.LagP99Seconds = s.Queues[0].LagP50Seconds, s.Queues[0].LagP99Seconds
	}
	return t
}

// Status takes a snapshot with one aggregate query over the effects (plus
// one read of pg_stat_activity for the xmin horizon). Run it inside a
// transaction to see both at one database clock.
func Status(ctx context.Context, db store.DBTX, opts StatusOptions) (*Snapshot, error) {
	opts = opts.withDefaults()
	h, err := store.ReadHorizon(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("ops: status: %w", err)
	}
	rows, err := store.Stats(ctx, db, opts.Filter.store(), opts.StalledAfter, opts.LagWindow)
	if err != nil {
		return nil, fmt.Errorf("ops: status: %w", err)
	}
	s := &Snapshot{
		TakenAt: h.Now, Filter: opts.Filter,
		StalledAfterSeconds: opts.StalledAfter.Seconds(), LagWindowSeconds: opts.LagWindow.Seconds(),
		CompletedWindow:      WindowLabel(opts.LagWindow),
		OldestXminAgeSeconds: h.OldestXminAge, XminHolders: h.Holders,
		Queues: []Counts{}, Types: []Counts{}, Paused: []QueuePause{},
	}
	paused, err := PausedQueues(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("ops: status: %w", err)
	}
	for _, p := range paused {
		if opts.Filter.Queue == "" || p.Queue == opts.Filter.Queue {
			s.Paused = append(s.Paused, p)
		}
	}
	// Rows come ordered by queue, its total rows first, then by type.
	for _, r := range rows {
		list := &s.Types
		if r.QueueTotal {
			list = &s.Queues
		}
		n := len(*list)
		if n == 0 || (*list)[n-1].Queue != r.Queue || (*list)[n-1].Type != r.Type {
			*list = append(*list, Counts{Queue: r.Queue, Type: r.Type})
			n++
		}
		(*list)[n-1].add(r)
	}
	return s, nil
}

// StatsCache shares one [Status] snapshot among the /metrics collector and
// the sampler, so a scrape reuses a recent snapshot instead of querying.
// Concurrent callers wait for one refresh and share its result.
//
// A status query's cost grows with the backlog (it counts every available
// row, and every pending stream effect): at 10M pending effects it ran for
// tens of seconds, and a sampler refreshing every 10 s kept a backend busy
// for the whole drain. A query that took at least StatsPauseFloor is
// therefore not repeated until StatsPause times its duration has passed
// since it ended: the cache's queries then take at most a tenth of one
// backend's time, and the snapshot served meanwhile is older.
type StatsCache struct {
	db     store.DBTX
	opts   StatusOptions
	maxAge time.Duration

	mu   sync.Mutex
	snap *Snapshot
	at   time.Time     // local monotonic time of snap
	took time.Duration // how long the query behind snap ran
}

// StatsPause and StatsPauseFloor: a status query of the StatsCache that ran
// for at least StatsPauseFloor (1 s) is repeated only after StatsPause (9)
// times its duration.
const (
	StatsPause      = 9
	StatsPauseFloor = time.Second
)

// pausing reports whether the last query was slow and too recent to repeat.
func (c *StatsCache) pausing() bool {
	return c.snap != nil && c.took >= StatsPauseFloor && time.Since(c.at) < StatsPause*c.took
}

// StatsCacheMaxAgeDefault is how long a cached snapshot serves scrapes.
const StatsCacheMaxAgeDefault = 15 * time.Second

// NewStatsCache returns a cache over db; maxAge ≤ 0 means
// StatsCacheMaxAgeDefault.
func NewStatsCache(db store.DBTX, opts StatusOptions, maxAge time.Duration) *StatsCache {
	if maxAge <= 0 {
		maxAge = StatsCacheMaxAgeDefault
	}
	return &StatsCache{db: db, opts: opts.withDefaults(), maxAge: maxAge}
}

// Get returns the cached snapshot if it is younger than the cache's max
// age, or the last query was slow and recent (StatsPause), else refreshes
// it.
func (c *StatsCache) Get(ctx context.Context) (*Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snap != nil && time.Since(c.at) < c.maxAge || c.pausing() {
		return c.snap, nil
	}
	return c.refreshLocked(ctx)
}

// Refresh queries now and caches the result, unless the last query was
// slow and recent (StatsPause): then it returns the cached snapshot.
func (c *StatsCache) Refresh(ctx context.Context) (*Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pausing() {
		return c.snap, nil
	}
	return c.refreshLocked(ctx)
}

func (c *StatsCache) refreshLocked(ctx context.Context) (*Snapshot, error) {
	start := time.Now()
	snap, err := Status(ctx, c.db, c.opts)
	if err != nil {
		return nil, err
	}
	c.snap, c.at, c.took = snap, time.Now(), time.Since(start)
	return snap, nil
}
