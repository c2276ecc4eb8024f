// Package keyscan walks the keys of one Redis server that match a pattern,
// with SCAN and a COUNT hint, a batch at a time: the exporter's scans and
// the manager's List share it.
package keyscan

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Walk calls each with every batch of keys of c that match pattern (SCAN
// MATCH pattern COUNT count), and whether more batches may follow, until
// the scan ends, each asks to stop, an error, or ctx ends. A batch is at most a few times count keys, so memory
// stays bounded whatever the keyspace holds; a key may come twice, as SCAN
// guarantees no more.
func Walk(ctx context.Context, c *redis.Client, pattern string, count int64, each func(keys []string, more bool) (stop bool, err error)) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, count).Result()
		if err != nil {
			return err
		}
		stop, err := each(keys, next != 0)
		if err != nil || stop || next == 0 {
			return err
		}
		cursor = next
	}
}
