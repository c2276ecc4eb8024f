package manager

import "time"

// SetConditionalRecheck sets how soon a Manager whose conditional commands
// a reply turned off looks at the servers again, until the test ends.
func SetConditionalRecheck(t interface{ Cleanup(func()) }, d time.Duration) {
	old := serverCmdsRecheck.Swap(int64(d))
	t.Cleanup(func() { serverCmdsRecheck.Store(old) })
}
