package benchkit

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// CommandTime returns a reader of the time the masters c talks to have
// spent running commands so far: the sum of usec over INFO commandstats,
// INFO itself left out, and the commands named in inner left out too. A
// script's line counts its whole run, inner commands included, and the
// servers count those again in their own lines: inner names the commands
// that, in the calls measured, only scripts run (an acquire+release's
// GET and DEL). Unlike server-cpu-us/op this leaves out reading, parsing
// and writing: it is what the commands themselves cost.
func CommandTime(b *testing.B, c redis.UniversalClient, inner ...string) func() time.Duration {
	skip := map[string]bool{"info": true}
	for _, name := range inner {
		skip[name] = true
	}
	return func() time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var (
			mu    sync.Mutex
			total time.Duration
		)
		add := func(ctx context.Context, n *redis.Client) error {
			info, err := n.Info(ctx, "commandstats").Result()
			if err != nil {
				return err
			}
			d := commandUsec(info, skip)
			mu.Lock()
			total += d
			mu.Unlock()
			return nil
		}
		eachServer(b, ctx, c, true, add)
		return total
	}
}

// commandUsec sums usec over an INFO commandstats reply, leaving out the
// commands in skip.
func commandUsec(info string, skip map[string]bool) time.Duration {
	var usec int64
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
		if !ok || skip[name] {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				usec += n
			}
		}
	}
	return time.Duration(usec) * time.Microsecond
}
