package pgtest

import (
	"context"
	"testing"
)

// TestNewDBHoldsEveryLine: the template applies the engine's line and both
// applications', each recorded in its own version table.
func TestNewDBHoldsEveryLine(t *testing.T) {
	t.Parallel()
	conn := connect(t, NewDB(t))
	ctx := context.Background()
	for _, l := range lines {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+l.VersionTable()+` WHERE version_id > 0 AND is_applied`).Scan(&n); err != nil {
			t.Fatalf("%s line: %v", l.Name, err)
		}
		if n == 0 {
			t.Errorf("%s line: no version recorded in %s", l.Name, l.VersionTable())
		}
	}
	var tables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE (schemaname, tablename) IN
		(('pgoutbox', 'effects'), ('control_plane', 'release_runs'), ('storage_documents', 'records'))`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 3 {
		t.Fatalf("%d of pgoutbox.effects, control_plane.release_runs, storage_documents.records exist, want 3", tables)
	}
}
