package cli

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// controlPlaneConfig reads the control plane's settings from the
// environment (README: "Release control plane").
func controlPlaneConfig() controlplane.Config {
	return controlplane.Config{
		WebhookSecret: []byte(os.Getenv("GITHUB_WEBHOOK_SECRET")),
		MaxBodyBytes:  int64(envInt("WEBHOOK_MAX_BODY_BYTES", controlplane.MaxBodyBytesDefault)),
		// 0: the default, MaxBufferedBytesDefault or twice the body limit.
		MaxBufferedBytes: int64(envInt("WEBHOOK_MAX_BUFFERED_BYTES", 0)),
		TagPattern:       envOr("RELEASE_TAG_PATTERN", controlplane.TagPatternDefault),
		Workflow:         envOr("RELEASE_WORKFLOW", controlplane.WorkflowDefault),
		CheckRunName:     envOr("CHECK_RUN_NAME", controlplane.CheckRunNameDefault),
		APIToken:         os.Getenv("PGOUTBOX_API_TOKEN"),
		MaxAttempts:      envInt("OUTBOX_MAX_ATTEMPTS", controlplane.MaxAttemptsDefault),
	}
}

// githubClient builds the GitHub App client from GITHUB_APP_ID,
// GITHUB_APP_PRIVATE_KEY or GITHUB_APP_PRIVATE_KEY_FILE, and GITHUB_API_URL.
// missing names the first absent setting.
func githubClient() (gh *github.Client, missing string, err error) {
	appID := os.Getenv("GITHUB_APP_ID")
	if appID == "" {
		return nil, "GITHUB_APP_ID", nil
	}
	pem := []byte(os.Getenv("GITHUB_APP_PRIVATE_KEY"))
	if len(pem) == 0 {
		path := os.Getenv("GITHUB_APP_PRIVATE_KEY_FILE")
		if path == "" {
			return nil, "GITHUB_APP_PRIVATE_KEY or GITHUB_APP_PRIVATE_KEY_FILE", nil
		}
		if pem, err = os.ReadFile(path); err != nil {
			return nil, "", fmt.Errorf("GITHUB_APP_PRIVATE_KEY_FILE: %w", err)
		}
	}
	key, err := github.ParsePrivateKey([]byte(strings.ReplaceAll(string(pem), `\n`, "\n")))
	if err != nil {
		return nil, "", err
	}
	api := envOr("GITHUB_API_URL", github.DefaultAPIURL)
	httpClient := &http.Client{Timeout: 20 * time.Second}
	tokens, err := github.NewTokenSource(httpClient, api, appID, key, nil)
	if err != nil {
		return nil, "", err
	}
	return github.NewClient(httpClient, api, tokens), "", nil
}

// controlPlaneApp is the release control plane for serve and work. It is
// not started when GITHUB_WEBHOOK_SECRET or the GitHub App settings are
// missing.
func controlPlaneApp(_ context.Context, d appDeps) (*application, string, error) {
	cfg := controlPlaneConfig()
	if len(cfg.WebhookSecret) == 0 {
		return nil, "release control plane: GITHUB_WEBHOOK_SECRET is not set", nil
	}
	gh, missing, err := githubClient()
	if err != nil {
		return nil, "", fmt.Errorf("release control plane: %w", err)
	}
	if missing != "" {
		return nil, "release control plane: " + missing + " is not set", nil
	}
	app, err := controlplane.New(d.pool, cfg, gh, d.log)
	if err != nil {
		return nil, "", err
	}
	return &application{
		name:   "release control plane",
		routes: app.Routes,
		queues: app.Queues(),
		types:  app.Types(),
	}, "", nil
}

// operatorApp opens the database and the control plane for a reconcile
// command; only inspect needs the GitHub App settings. Call the returned
// function when done.
func (g *globals) operatorApp(ctx context.Context, needGitHub bool) (*controlplane.App, func(), error) {
	var gh controlplane.GitHub
	if needGitHub {
		client, missing, err := githubClient()
		if err != nil {
			return nil, nil, &ExitError{Code: ExitCouldNotRun, Err: err}
		}
		if missing != "" {
			return nil, nil, &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("%s is not set (needed to ask GitHub for workflow runs)", missing)}
		}
		gh = client
	}
	return g.operatorAppWith(ctx, gh)
}

// operatorAppWith is operatorApp with a given GitHub client (nil: none).
func (g *globals) operatorAppWith(ctx context.Context, gh controlplane.GitHub) (*controlplane.App, func(), error) {
	pool, _, err := g.open(ctx, false)
	if err != nil {
		return nil, nil, err
	}
	app, err := controlplane.ForOperations(pool, controlPlaneConfig(), gh, g.logger())
	if err != nil {
		pool.Close()
		return nil, nil, &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	return app, pool.Close, nil
}
