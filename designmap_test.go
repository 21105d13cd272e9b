package pgoutbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDesignMapMatchesTheCode holds docs/design.md's map of the house to the
// module: every package directory `go list ./...` names appears in the map
// as "dir/", every room the map names (the first word of a line of its
// listing) exists in the checkout, and no package imports a package of a
// later layer of the map (a package belongs to the room that is the longest
// prefix of its path; the root package to the first layer), except the
// arrows in upward.
func TestDesignMapMatchesTheCode(t *testing.T) {
	// upward are the arrows to a later layer that docs/design.md names.
	upward := map[string]bool{"adapters/github/githubtest -> controlplane/webhook": true}
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	const heading = "## The house's map"
	_, section, ok := strings.Cut(string(doc), heading)
	if !ok {
		t.Fatalf("docs/design.md has no section %q", heading)
	}
	_, listing, ok := strings.Cut(section, "```\n")
	if ok {
		listing, _, ok = strings.Cut(listing, "```")
	}
	if !ok {
		t.Fatalf("docs/design.md's %q has no ``` listing", heading)
	}

	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the module's packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-f", "{{.Dir}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dirs := strings.Fields(string(out))
	if len(dirs) < 20 {
		t.Fatalf("go list ./... printed %d directories: not the module's packages", len(dirs))
	}
	for _, d := range dirs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		if rel == "." {
			continue // the root package: "*.go (root)"
		}
		if !strings.Contains(listing, filepath.ToSlash(rel)+"/") {
			t.Errorf("docs/design.md's map does not name %s/ (a package of the module): add its room", filepath.ToSlash(rel))
		}
	}

	// A room is the first word of a listing line that is indented by two
	// spaces (the layers are not indented, continuations are indented more).
	room := regexp.MustCompile(`(?m)^  ([A-Za-z0-9_.][A-Za-z0-9_./-]*/)`)
	rooms := room.FindAllStringSubmatch(listing, -1)
	if len(rooms) < 20 {
		t.Fatalf("found %d rooms in docs/design.md's map: not the listing", len(rooms))
	}
	for _, m := range rooms {
		if _, err := os.Stat(m[1]); err != nil {
			t.Errorf("docs/design.md's map names %s, which does not exist: %v", m[1], err)
		}
	}

	// Layers: an unindented line starts one; its rooms follow.
	layerOf := map[string]int{} // room ("dir/") → layer index
	layer := -1
	for _, line := range strings.Split(listing, "\n") {
		switch {
		case line == "":
		case !strings.HasPrefix(line, " "):
			layer++
		default:
			if m := room.FindStringSubmatch(line); m != nil {
				layerOf[m[1]] = layer
			}
		}
	}
	if layer < 3 {
		t.Fatalf("found %d layers in docs/design.md's map: not the listing", layer+1)
	}
	const module = "github.com/pgoutbox/pgoutbox"
	rankOf := func(pkg string) (string, int) {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		best, rank := "", 0 // the root package: the first layer
		for r, l := range layerOf {
			if strings.HasPrefix(rel+"/", r) && len(r) > len(best) {
				best, rank = r, l
			}
		}
		return rel, rank
	}
	imports, err := exec.Command(goBin, "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	arrows := 0
	for _, line := range strings.Split(strings.TrimSpace(string(imports)), "\n") {
		f := strings.Fields(line)
		from, fromRank := rankOf(f[0])
		for _, imp := range f[1:] {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			arrows++
			to, toRank := rankOf(imp)
			if toRank > fromRank && !upward[from+" -> "+to] {
				t.Errorf("%s imports %s, a room of a later layer of docs/design.md's map: move one of them, or name the exception in design.md and here", from, to)
			}
		}
	}
	if arrows < 50 {
		t.Fatalf("found %d imports between the module's packages: go list's output was not read", arrows)
	}
}

// TestDesignMigrationTableMatchesFiles holds docs/design.md's table of
// migration lines to the files: each line's row lists exactly the versions
// of the numbered .sql files in its folder, in order.
func TestDesignMigrationTableMatchesFiles(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| [a-z ]+ \\| `([a-z/]+/)` \\| ([0-9 ]+) \\|")
	rows := row.FindAllStringSubmatch(string(doc), -1)
	if len(rows) != 3 {
		t.Fatalf("docs/design.md has %d rows of migration lines, want 3 (engine, control plane, projection)", len(rows))
	}
	version := regexp.MustCompile(`^([0-9]+)_.*\.sql$`)
	for _, r := range rows {
		dir, listed := r[1], strings.Join(strings.Fields(r[2]), " ")
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("docs/design.md lists the migration folder %s: %v", dir, err)
		}
		var files []string
		for _, e := range entries {
			if m := version.FindStringSubmatch(e.Name()); m != nil {
				files = append(files, m[1])
			}
		}
		if got := strings.Join(files, " "); got != listed {
			t.Errorf("docs/design.md lists %s as versions %q; its files are %q", dir, listed, got)
		}
	}
}
