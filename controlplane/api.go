package controlplane

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// StartRequest is the body of POST /api/release-runs.
type StartRequest struct {
	// RepositoryID or Repository ("owner/name") selects an installed repository.
	RepositoryID int64  `json:"repository_id"`
	Repository   string `json:"repository"`
	// Ref is the tag ref (e.g. refs/tags/v1.2.3); a bare tag gets refs/tags/.
	Ref string `json:"ref"`
	// HeadSHA is the commit to release (40 hex characters).
	HeadSHA string `json:"head_sha"`
}

var shaRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// startRunAPI starts a release run by hand: 201 with the run (200 when it
// already existed), 400 for bad input, 404 for a repository that is not
// installed.
func (a *App) startRunAPI(w http.ResponseWriter, r *http.Request) {
	var req StartRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpx.Error(w, http.StatusBadRequest, "body must be JSON: "+err.Error())
		return
	}
	if req.Ref != "" && !strings.HasPrefix(req.Ref, "refs/") {
		req.Ref = "refs/tags/" + req.Ref
	}
	switch {
	case req.RepositoryID == 0 && req.Repository == "":
		httpx.Error(w, http.StatusBadRequest, "repository_id or repository is required")
		return
	case req.Ref == "" || len(req.Ref) > 255:
		httpx.Error(w, http.StatusBadRequest, "ref is required")
		return
	case !shaRE.MatchString(req.HeadSHA):
		httpx.Error(w, http.StatusBadRequest, "head_sha must be 40 lower-case hex characters")
		return
	}
	var started StartedRun
	err := pgx.BeginFunc(r.Context(), a.pool, func(tx pgx.Tx) error {
		repo, err := activeRepository(r.Context(), tx, req.RepositoryID, req.Repository)
		if err != nil {
			return err
		}
		started, err = a.startRun(r.Context(), tx, repo, req.Ref, req.HeadSHA, "api")
		return err
	})
	switch {
	case errors.Is(err, errNotInstalled):
		httpx.Error(w, http.StatusNotFound, "repository not installed")
	case err != nil:
		a.log.Error("start release run", "err", err)
		httpx.Error(w, http.StatusServiceUnavailable, "could not start the release run")
	case started.Existing:
		httpx.WriteJSON(w, http.StatusOK, started)
	default:
		httpx.WriteJSON(w, http.StatusCreated, started)
	}
}
