package webhook_test

import (
	"fmt"

	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

func Example() {
	secret := []byte("webhook-secret")
	body := []byte(`{"ref":"refs/tags/v1.0.0","before":"0000000000000000000000000000000000000000",` +
		`"after":"6113728f27ae82c7b1a177c8d03f9e96e0adf246","created":true,` +
		`"repository":{"id":186853002,"full_name":"Codertocat/Hello-World","default_branch":"main"},` +
		`"installation":{"id":957387}}`)

	// What GitHub sends in X-Hub-Signature-256.
	header := webhook.Sign(secret, body)

	if err := webhook.Verify(secret, body, header); err != nil {
		fmt.Println("reject:", err)
		return
	}
	n, err := webhook.Normalize("push", body)
	if err != nil {
		fmt.Println("malformed:", err)
		return
	}
	fmt.Println(n.InstallationID, n.RepositoryFullName, n.Push.Ref, n.Push.After)

	fmt.Println(webhook.Verify(secret, body, "sha1=0123"))
	// Output:
	// 957387 Codertocat/Hello-World refs/tags/v1.0.0 6113728f27ae82c7b1a177c8d03f9e96e0adf246
	// webhook: bad X-Hub-Signature-256 signature
}
