package githubtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// PayloadsRelDir is where GitHub's example webhook payloads live, relative
// to the module root: one folder per event (the X-GitHub-Event name), one
// JSON file per action or variant (octokit/webhooks, MIT licence; see the
// README and LICENSE there).
const PayloadsRelDir = "testdata/github-webhooks"

// minPayloadEvents is the fewest event folders a complete corpus holds; a
// corpus with fewer is reported as broken rather than silently tested.
const minPayloadEvents = 50

// Payload is one example webhook payload.
type Payload struct {
	// Event is the X-GitHub-Event name (the folder's name).
	Event string
	// Name is the file's name, e.g. "completed.payload.json".
	Name string
	// Body is the file's exact bytes; sign these, never a re-encoding.
	Body []byte
}

// PayloadsDir locates the example payload folder: PayloadsRelDir under the
// module root, found by walking up from the working directory to the
// directory holding go.mod. It never looks outside the checkout, and it
// fails, rather than letting tests skip, when the folder is missing.
func PayloadsDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			c := filepath.Join(dir, filepath.FromSlash(PayloadsRelDir))
			if fi, err := os.Stat(c); err != nil || !fi.IsDir() {
				return "", fmt.Errorf("githubtest: webhook payload corpus not found at %s (it is part of the repository)", c)
			}
			return c, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("githubtest: no go.mod above the working directory, so no %s", PayloadsRelDir)
		}
		dir = parent
	}
}

// Payloads reads every example payload, sorted by event then file name. It
// fails when the corpus is missing or has fewer than 50 event folders.
func Payloads() ([]Payload, error) {
	root, err := PayloadsDir()
	if err != nil {
		return nil, err
	}
	events, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []Payload
	seen := 0
	for _, e := range events {
		if !e.IsDir() {
			continue
		}
		seen++
		files, err := os.ReadDir(filepath.Join(root, e.Name()))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if f.IsDir() || !strings.HasSuffix(f.Name(), ".json") {
				continue
			}
			body, err := os.ReadFile(filepath.Join(root, e.Name(), f.Name()))
			if err != nil {
				return nil, err
			}
			out = append(out, Payload{Event: e.Name(), Name: f.Name(), Body: body})
		}
	}
	if seen < minPayloadEvents {
		return nil, fmt.Errorf("githubtest: webhook payload corpus at %s has %d event folders, want at least %d", root, seen, minPayloadEvents)
	}
	slices.SortFunc(out, func(a, b Payload) int {
		return strings.Compare(a.Event+"/"+a.Name, b.Event+"/"+b.Name)
	})
	return out, nil
}

// LoadPayload reads the example payload event/name.
func LoadPayload(event, name string) ([]byte, error) {
	root, err := PayloadsDir()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(root, event, name))
}
