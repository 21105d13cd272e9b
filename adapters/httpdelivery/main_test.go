package httpdelivery_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() error {
		return goleak.Find(goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
	})
}
