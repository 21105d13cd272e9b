package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// runInfo is what the cost curves (-curves) and the held-xmin scenario
// (-xmin) record of their machine and server, at the head of the JSON they
// write (embedded, so its fields stay top-level keys).
type runInfo struct {
	Started    string  `json:"started"`
	Seconds    float64 `json:"seconds"`
	CPUs       int     `json:"cpus"`
	Go         string  `json:"go"`
	PostgreSQL string  `json:"postgresql"`
	Settings   string  `json:"settings"`
	LoadBefore string  `json:"load_before"`
	LoadAfter  string  `json:"load_after"`
	Flags      string  `json:"flags"`
}

// newRunInfo records the start of a run: the time, this machine, the
// server's version and the given server settings (name=value, by name).
func newRunInfo(ctx context.Context, admin *pgxpool.Pool, settings ...string) runInfo {
	r := runInfo{
		Started: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Go: runtime.Version(),
		LoadBefore: loadAvg(), Flags: recordedFlags(),
	}
	_ = admin.QueryRow(ctx, "SELECT current_setting('server_version')").Scan(&r.PostgreSQL)
	_ = admin.QueryRow(ctx, `SELECT string_agg(name || '=' || current_setting(name), ' ' ORDER BY name) FROM pg_settings
		WHERE name = ANY($1::text[])`, settings).Scan(&r.Settings)
	return r
}

// finish records the end of a run that began at began.
func (r *runInfo) finish(began time.Time) {
	r.Seconds = time.Since(began).Seconds()
	r.LoadAfter = loadAvg()
}

// caption is the run's line under a plot's title.
func (r *runInfo) caption() string {
	return fmt.Sprintf("%s UTC · %d CPUs shared with other work: load average %s before, %s after · PostgreSQL %s · %s",
		strings.Replace(strings.TrimSuffix(r.Started, "Z"), "T", " ", 1), r.CPUs, r.LoadBefore, r.LoadAfter, strings.Fields(r.PostgreSQL + " ")[0], r.Go)
}

// writeJSON writes v, indented, to path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
