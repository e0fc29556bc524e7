package mysqldriver_test

import (
	"os"
	"testing"

	"github.com/billing/ledger/integration/harness"
)

// TestMain removes the containers the harness may start for these tests
// (its testcontainers path); see harness.Main.
func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
