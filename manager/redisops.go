package manager

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
)

// minServer is the oldest Redis shardlock supports: SET ... NX GET needs
// 6.2, and 7.0 is the oldest release still maintained that has sharded
// pub/sub and the cluster behaviour we test against.
const minServer = "7.0.0"

// formatMs is a duration as a script's argument in milliseconds.
func formatMs(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// luaFlag is a script's boolean argument: "1" or "0".
func luaFlag(on bool) string {
	if on {
		return "1"
	}
	return "0"
}

// Script arguments boxed once: a string put into an interface anew costs
// an allocation on every call.
var (
	luaTrue  any = "1"
	luaFalse any = "0"
)

// luaArg is luaFlag(on) as a script argument.
func luaArg(on bool) any {
	if on {
		return luaTrue
	}
	return luaFalse
}

// startupCheck checks that every master is new enough and preloads the
// scripts on every master. A reply that says "not now" (a server loading
// its data, a cluster that is down or failing over: see isNotNow) makes it
// look again (retryWhile's backoff, the slot map reloaded) until ctx ends;
// then it returns that reply with ctx's error.
func (m *Manager) startupCheck(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err // nothing sent
	}
	return m.tr.RetryWhile(ctx, time.Time{}, transport.IsNotNow, m.startupCheckOnce)
}

// startupCheckOnce makes the startup check's commands once.
func (m *Manager) startupCheckOnce(ctx context.Context) error {
	check := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "server").Result()
		if transport.IsReply(err) {
			return nil // a server that does not say its version (an emulator); nothing to check
		}
		if err != nil {
			return err
		}
		v := infoField(info, "redis_version")
		if v != "" && versionLess(v, minServer) {
			return &ServerVersionError{Addr: c.Options().Addr, Version: v, Need: minServer}
		}
		return nil
	}
	if err := m.tr.EachMaster(ctx, check); err != nil {
		return err
	}
	for _, s := range scripts.All() {
		if err := s.Load(ctx, m.tr.Client()).Err(); err != nil {
			return err
		}
	}
	return nil
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// versionLess compares dotted versions numerically.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}
