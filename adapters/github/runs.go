package github

import (
	"context"
	"errors"
	"net/http"
	"strconv"
)

// ErrNotFound matches (errors.Is) the error of a call GitHub answered 404:
// the resource does not exist, or the installation cannot see it (GitHub
// answers 404 rather than 403 for a repository outside the installation).
var ErrNotFound = errors.New("github: not found")

// notFoundError is a 404 answer: its text is the call's, and it matches
// ErrNotFound.
type notFoundError struct{ err error }

func (e *notFoundError) Error() string        { return e.err.Error() }
func (e *notFoundError) Unwrap() error        { return e.err }
func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }

// GetWorkflowRun returns workflow run runID of repo
// (GET /repos/{owner}/{repo}/actions/runs/{run_id}). A run that does not
// exist in that repository is an error matching ErrNotFound.
func (c *Client) GetWorkflowRun(ctx context.Context, installationID int64, repo string, runID int64) (WorkflowRun, error) {
	p, err := repoPath(repo)
	if err != nil {
		return WorkflowRun{}, err
	}
	var out WorkflowRun
	err = c.do(ctx, installationID, http.MethodGet, p+"/actions/runs/"+strconv.FormatInt(runID, 10), nil, &out, true)
	return out, err
}
