package anylang

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestPackedClientWorksInAFreshProject: `npm pack` of clients/typescript
// makes a tarball that installs into a new project and runs the README's
// node-postgres example as written (with the orders table and orderId it
// assumes): the effect is committed with the order's update.
func TestPackedClientWorksInAFreshProject(t *testing.T) {
	node, npm := tool(t, "node"), tool(t, "npm")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pkg, err := filepath.Abs("../../clients/typescript")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, ctx, pkg) // prepack builds with the dev dependencies
	// As in a fresh clone: no dist/ until the pack builds it.
	if err := os.RemoveAll(filepath.Join(pkg, "dist")); err != nil {
		t.Fatal(err)
	}
	packs := t.TempDir()
	tarball := strings.TrimSpace(lastLine(run(t, ctx, pkg, nil, npm, "pack", "--silent", "--pack-destination", packs)))
	listing := run(t, ctx, packs, nil, "tar", "-tzf", tarball)
	for _, f := range []string{"package/dist/index.js", "package/dist/index.d.ts", "package/package.json"} {
		if !strings.Contains(listing, f) {
			t.Fatalf("the packed tarball lacks %s:\n%s", f, listing)
		}
	}

	readme, err := os.ReadFile(filepath.Join(pkg, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## node-postgres\n\n```ts\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no node-postgres example")
	}
	project := t.TempDir()
	if err := os.WriteFile(filepath.Join(project, "package.json"), []byte(`{"name": "fresh", "private": true, "type": "module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, project, nil, npm, "install", "--no-audit", "--no-fund", filepath.Join(packs, tarball), "pg@8")
	pool, dsn := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL);
		INSERT INTO orders VALUES (42, 'open')`); err != nil {
		t.Fatal(err)
	}
	example := "const orderId = 42;\n" + string(m[1]) + "await pool.end();\n"
	if err := os.WriteFile(filepath.Join(project, "example.mjs"), []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, project, []string{"DATABASE_URL=" + dsn}, node, "example.mjs")
	var state, payload string
	if err := pool.QueryRow(ctx, `SELECT o.state, e.payload::text FROM orders o, pgoutbox.effects e
		WHERE o.id = 42 AND e.queue = 'emails' AND e.effect_type = 'email.receipt'`).Scan(&state, &payload); err != nil {
		t.Fatalf("after the README's example: %v", err)
	}
	if state != "paid" || payload != `{"order_id": 42}` {
		t.Fatalf("after the README's example: order %s, effect payload %s; want paid and {\"order_id\": 42}", state, payload)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
