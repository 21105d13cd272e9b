package github_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

// ExampleTokenSource authenticates as a GitHub App (here against the
// emulator) and obtains an installation token, which is then cached.
func ExampleTokenSource() {
	gh := fakegh.New(fakegh.Options{})
	defer gh.Close()
	_ = gh.AddInstallation(957387, "Codertocat")

	// GITHUB_APP_PRIVATE_KEY holds the PEM GitHub generated for the app.
	key, err := github.ParsePrivateKey(gh.AppPrivateKeyPEM())
	if err != nil {
		fmt.Println(err)
		return
	}
	ts, err := github.NewTokenSource(gh.Client(), gh.URL(), gh.AppID(), key, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	first, _ := ts.Token(context.Background(), 957387)
	second, _ := ts.Token(context.Background(), 957387)
	fmt.Println(strings.HasPrefix(first, "ghs_"), first == second, len(gh.Calls()))

	_, err = ts.Token(context.Background(), 1)
	fmt.Println(err)
	// Output:
	// true true 1
	// github: installation 1 access token: HTTP 404: Not Found
}
