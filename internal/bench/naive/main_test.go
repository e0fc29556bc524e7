package naive_test

import (
	"os"
	"testing"

	"github.com/billing/ledger/internal/testenv"
)

// TestMain removes the containers the test environment may start for these tests
// (its testcontainers path); see testenv.Main.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
