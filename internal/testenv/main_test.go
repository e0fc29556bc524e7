package testenv

import (
	"os"
	"testing"
)

// TestMain removes the containers the tests of the test environment itself start
// on the testcontainers path.
func TestMain(m *testing.M) { os.Exit(Main(m)) }
