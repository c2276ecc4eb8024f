package benchkit

import (
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Counter is a counter that processes share through a file mapped into
// each of them: the fleet's processes take their operations from it as
// the goroutines of Run take theirs from an atomic counter, at no cost
// beside an atomic add.
type Counter struct {
	mem []byte
	n   *int64
}

// OpenCounter maps the counter kept in the file at path, which it creates
// (starting at zero) if missing.
func OpenCounter(path string) (*Counter, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(8); err != nil {
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, 8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	// The mapping starts on a page: the int64 is aligned.
	return &Counter{mem: mem, n: (*int64)(unsafe.Pointer(&mem[0]))}, nil
}

// Add adds d to the counter and returns the new value.
func (c *Counter) Add(d int64) int64 { return atomic.AddInt64(c.n, d) }

// Close unmaps the counter.
func (c *Counter) Close() error { return syscall.Munmap(c.mem) }
