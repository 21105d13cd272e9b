package githubtest_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

// Example dispatches the documented release workflow through the emulator,
// loses the response of a second dispatch, and inspects what happened.
func Example() {
	srv := fakegh.New(fakegh.Options{})
	defer srv.Close()
	_ = srv.AddInstallation(1, "acme")
	_ = srv.AddRepository(1, 10, "acme/widgets")

	ts, _ := github.NewTokenSource(srv.Client(), srv.URL(), srv.AppID(), srv.AppPrivateKey(), nil)
	token, _ := ts.Token(context.Background(), 1)

	dispatch := func(attempt int) (int, error) {
		body := fmt.Sprintf(`{"ref":"refs/tags/v1.0.0","inputs":{"release_run_id":"12","execution_attempt_id":"%d"}}`, attempt)
		req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/repos/acme/widgets/actions/workflows/release.yml/dispatches", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	status, _ := dispatch(1)
	fmt.Println("first dispatch:", status)

	srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Times: 1, Kind: fakegh.FaultLoseResponse})
	_, err := dispatch(2)
	fmt.Println("second dispatch answered:", err == nil)

	for _, run := range srv.WorkflowRuns() {
		fmt.Println(run.DisplayTitle, run.HeadBranch, run.Status)
	}
	// Output:
	// first dispatch: 204
	// second dispatch answered: false
	// release 12 attempt 1 v1.0.0 queued
	// release 12 attempt 2 v1.0.0 queued
}
