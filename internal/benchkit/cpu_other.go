//go:build !linux

package benchkit

import "time"

// selfCPU, processCPU and processReads are only read on Linux.
func selfCPU() (time.Duration, bool)           { return 0, false }
func processCPU(pid int) (time.Duration, bool) { return 0, false }
func processReads(pid int) (int64, bool)       { return 0, false }
