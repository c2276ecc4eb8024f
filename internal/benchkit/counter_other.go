//go:build !linux

package benchkit

import "errors"

// Counter is a counter that processes share; fleet runs need Linux.
type Counter struct{}

// OpenCounter fails: fleet runs need Linux.
func OpenCounter(path string) (*Counter, error) {
	return nil, errors.New("benchkit: a counter shared by processes needs Linux")
}

// Add is never called: OpenCounter fails.
func (c *Counter) Add(d int64) int64 { return 0 }

// Close does nothing.
func (c *Counter) Close() error { return nil }
