package github

import (
	"errors"
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

// Payload is one example webhook payload.
type Payload struct {
	// Event is the X-GitHub-Event name (the folder's name).
	Event string
	// Name is the file's name, e.g. "completed.payload.json".
	Name string
	// Body is the file's exact bytes; sign these, never a re-encoding.
	Body []byte
}

// PayloadsDir locates the example payload folder: PayloadsRelDir from the
// module root, found by walking up from the working directory (a test's
// working directory is its package's folder) to the directory holding
// go.mod. It fails, rather than letting tests skip, when the folder is
// absent.
func PayloadsDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("fakes/github: no go.mod above the working directory")
		}
		dir = parent
	}
	payloads := filepath.Clean(filepath.Join(dir, filepath.FromSlash(PayloadsRelDir)))
	if fi, err := os.Stat(payloads); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("fakes/github: webhook payload corpus not found at %s (expected %s next to the module root)", payloads, PayloadsRelDir)
	}
	return payloads, nil
}

// Payloads reads every example payload, sorted by event and file name.
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
