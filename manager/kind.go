package manager

import (
	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/scripts"
)

// batchInfo is what a batch lock holds besides a single lock's fields.
type batchInfo struct {
	resources []string
	keys      []string
	fences    []uint64
}

func (b *batchInfo) heldError(idx []int) error {
	held := make([]string, 0, len(idx))
	for _, i := range idx {
		if i >= 1 && i <= len(b.resources) {
			held = append(held, b.resources[i-1])
		}
	}
	return &BatchHeldError{Held: held}
}

// rwMode says whether an acquire or a lock is a read-write lock's, and
// which side of it.
type rwMode uint8

const (
	rwNone  rwMode = iota // an exclusive lock
	rwRead                // a reader of a read-write lock
	rwWrite               // the writer of a read-write lock
)

// arg is the mode as rw_acquire.lua takes it.
func (mo rwMode) arg() string {
	if mo == rwRead {
		return "r"
	}
	return "w"
}

// scripts returns the scripts that act on a held lock of mode mo: its
// release, extend and TTL read.
func (mo rwMode) scripts() (release, extend, pttl *redis.Script) {
	if mo == rwNone {
		return scripts.Release, scripts.Extend, scripts.PTTL
	}
	return scripts.RWRelease, scripts.RWExtend, scripts.RWPTTL
}
