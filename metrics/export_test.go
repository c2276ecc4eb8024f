package metrics

import "github.com/prometheus/client_golang/prometheus"

// AcquiredCounterForTest exposes a class's attempts counter to tests.
func (c *Class) AcquiredCounterForTest() prometheus.Counter { return c.attempts }
