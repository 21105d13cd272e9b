package main

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestMain stops the throwaway cluster pgtest may start for the tests that
// need a server (the ones that call pgtest.NewDB).
func TestMain(m *testing.M) { pgtest.Main(m) }
