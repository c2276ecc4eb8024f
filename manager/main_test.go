package manager_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every test must leave no goroutine behind: the watchdog, auto-pipeliners
// and clients all have owners that stop them. The one exception is
// go-redis's dial prober, which a client whose dials keep failing (a test's
// cut traffic) starts: it sleeps a second between probes and returns at the
// first one after its client is closed.
//
// A test binary started as a process of a fleet benchmark run
// (benchHandoffFleet) is that process and runs no test.
func TestMain(m *testing.M) {
	if cfg := os.Getenv(handoffChildEnv); cfg != "" {
		os.Exit(handoffChild(cfg))
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
