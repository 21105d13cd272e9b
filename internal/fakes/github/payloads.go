package github

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// PayloadsRelDir is where GitHub's example webhook payloads live, relative
// to the module root: one folder per event (the X-GitHub-Event name), one
// JSON file per action or variant (octokit/webhooks, MIT licence).
const PayloadsRelDir = "../shared/testdata/github-webhooks"

// PayloadsEnv names an environment variable that, when set, is the corpus
// folder (for checkouts that do not sit beside shared/).
const PayloadsEnv = "PGOUTBOX_WEBHOOK_CORPUS"

// PayloadsSharedDir is the corpus's place on the team's machines, tried
// after the module-relative path (a clean checkout elsewhere, e.g. CI).
const PayloadsSharedDir = "/work/shared/testdata/github-webhooks"

// Payload is one example webhook payload.
type Payload struct {
	// Event is the X-GitHub-Event name (the folder's name).
	Event string
	// Name is the file's name, e.g. "completed.payload.json".
	Name string
	// Body is the file's exact bytes; sign these, never a re-encoding.
	Body []byte
}

// PayloadsDir locates the example payload folder: $PGOUTBOX_WEBHOOK_CORPUS
// when set, else PayloadsRelDir from the module root (found by walking up
// from the working directory to the directory holding go.mod), else
// PayloadsSharedDir. It fails, rather than letting tests skip, when none
// exists.
func PayloadsDir() (string, error) {
	var candidates []string
	if env := os.Getenv(PayloadsEnv); env != "" {
		candidates = append(candidates, env)
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			candidates = append(candidates, filepath.Clean(filepath.Join(dir, filepath.FromSlash(PayloadsRelDir))))
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	candidates = append(candidates, PayloadsSharedDir)
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.IsDir() {
			return c, nil
		}
	}
	return "", fmt.Errorf("fakes/github: webhook payload corpus not found (looked in %s; set %s)",
		strings.Join(candidates, ", "), PayloadsEnv)
}

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
	for _, e := range events {
		if !e.IsDir() {
			continue
		}
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
