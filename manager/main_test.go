package manager_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test must leave no goroutine behind: the watchdog, auto-pipeliners
// and clients all have owners that stop them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
