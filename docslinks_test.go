package pgoutbox_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestDocsLinksResolve checks every relative Markdown link of the
// repository's documents: its file exists and, when it names an anchor in a
// Markdown file, that file has a heading with that anchor (GitHub's slug:
// lower case, punctuation other than '-' and '_' dropped, spaces → '-').
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "README.md", "CONTRIBUTING.md", "CHANGELOG.md",
		filepath.Join("clients", "typescript", "README.md"))
	if len(files) < 10 {
		t.Fatalf("found %d documents: not the repository's", len(files))
	}
	fence := regexp.MustCompile("(?s)```.*?```")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	scheme := regexp.MustCompile(`^[a-z]+:`)
	anchors := map[string]map[string]bool{}
	links := 0
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(fence.ReplaceAllString(string(text), ""), -1) {
			target := m[1]
			if scheme.MatchString(target) {
				continue // http:, https:, mailto:
			}
			links++
			path, anchor, _ := strings.Cut(target, "#")
			resolved := f
			if path != "" {
				resolved = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
			}
			if _, err := os.Stat(resolved); err != nil {
				t.Errorf("%s links to %s, which does not exist", f, target)
				continue
			}
			if anchor == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			if anchors[resolved] == nil {
				anchors[resolved] = headingAnchors(t, resolved)
			}
			if !anchors[resolved][anchor] {
				t.Errorf("%s links to %s, but %s has no heading with that anchor", f, target, resolved)
			}
		}
	}
	if links < 50 {
		t.Fatalf("found %d relative links: the link pattern is broken", links)
	}
}

// headingAnchors returns the anchors GitHub gives the headings of file.
func headingAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}
