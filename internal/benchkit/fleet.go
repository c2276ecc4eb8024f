package benchkit

import (
	"testing"
	"time"
)

// A fleet run is one whose clients are other processes (child processes of
// the benchmark, each with its own Go runtime, as the instances of a
// service are): they share the run's operations through a Counter, and
// each measures its own CPU time with SelfCPU.

// SelfCPU returns this process's CPU time so far (user and system), and
// false where the system does not report it.
func SelfCPU() (time.Duration, bool) { return selfCPU() }

// MeasureFleet starts measuring the servers' CPU time and read system
// calls, as Measure does; the function it returns reports them per
// operation, for n operations since, beside clients, the CPU time the
// fleet's processes used meanwhile (client-cpu-us/op; negative: not
// known, not reported).
func MeasureFleet(servers Servers) (report func(b *testing.B, n int, clients time.Duration)) {
	u0 := usageOf(servers)
	return func(b *testing.B, n int, clients time.Duration) {
		// The fleet's CPU time stands in for this process's.
		from, to := u0, usageOf(servers)
		from.self, to.self = 0, clients
		to.cpuOK = to.cpuOK && clients >= 0
		to.report(b, from, servers, n)
	}
}
