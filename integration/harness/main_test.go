package harness

import (
	"os"
	"testing"
)

// TestMain removes the containers the tests of the harness itself start
// on the testcontainers path.
func TestMain(m *testing.M) { os.Exit(Main(m)) }
