//go:build !linux

package benchkit

import "time"

// selfCPU and processCPU are only read on Linux.
func selfCPU() (time.Duration, bool)           { return 0, false }
func processCPU(pid int) (time.Duration, bool) { return 0, false }
