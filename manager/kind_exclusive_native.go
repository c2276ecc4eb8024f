package manager

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
)

// kindExclusiveNative is kindExclusive spoken in the conditional commands
// of newer servers, where every master has them (Valkey 9.0 and later): a
// release of a lock nobody queued for is DELIFEQ, an extend is SET ...
// IFEQ ... PX. Both are single-key commands the server runs without Lua.
// When one answers that it did nothing (the key is gone, holds another
// token, was force-released, or carries the queued mark), or answers an
// error, the call goes again as kindExclusive's script, which tells these
// apart (and hands the lock to a queued waiter): the results and errors
// callers see are the script path's. Everything else (the acquire, a
// release that queues this process's next waiter, the watchdog's
// pipelined renewals, Close's releases) is kindExclusive's, and so are the
// release and extend of a lock that came through Redis's queue
// (Lock.viaQueue): its key carries the queued mark, which the conditional
// commands' bare token would not match.
//
// acquire chooses it for an unfenced exclusive lock when New found the
// commands on every master (conditionalCommands) and WithConditionalCommands
// is not off. A reply of "unknown command" (a master failed over to an
// older replica, or the command was renamed away) turns it off for the
// Manager, with one log line; the call goes by the script, and the Manager
// looks at the masters' command tables again later (recheckConditional).
var kindExclusiveNative lockKind = exclusiveNativeKind{}

type exclusiveNativeKind struct{ exclusiveKind }

func (exclusiveNativeKind) release(m *Manager, ctx context.Context, l *Lock, entry string, local, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	if entry == "" && !l.viaQueue && m.conditional.Load() {
		cmd := redis.NewIntCmd(ctx, "delifeq", l.key, l.args[0])
		err := m.tr.Process(ctx, m.cmd, cmd)
		if err == nil && cmd.Val() == 1 {
			return nil, scripts.Done, 0, nil
		}
		if err != nil && !m.scriptAfter(err) {
			return nil, 0, 0, err
		}
	}
	return releaseBy(kindExclusive, m, ctx, l, entry, local, ambiguous, sentAt, validUntil)
}

func (exclusiveNativeKind) extend(m *Manager, ctx context.Context, l *Lock, ttlMs string) (int64, error) {
	if !l.viaQueue && m.conditional.Load() {
		cmd := redis.NewStatusCmd(ctx, "set", l.key, l.args[0], "ifeq", l.args[0], "px", ttlMs)
		err := m.tr.Process(ctx, m.cmd, cmd)
		if err == nil {
			return scripts.Done, nil
		}
		if err != redis.Nil && !m.scriptAfter(err) {
			return 0, err
		}
	}
	return extendBy(kindExclusive, m, ctx, l, ttlMs)
}

// scriptAfter reports whether a conditional command's error is one the
// script form of the call answers in its own way: an error reply that is
// not transient (WRONGTYPE, an unknown command, no permission). An unknown
// command turns the conditional commands off for the Manager.
func (m *Manager) scriptAfter(err error) bool {
	if !transport.IsReply(err) || transport.IsTransient(err) {
		return false
	}
	if msg, _ := transport.ReplyMsg(err); strings.HasPrefix(msg, "ERR unknown command") || strings.HasPrefix(msg, "NOPERM") {
		if m.conditional.CompareAndSwap(true, false) {
			m.log.Warn("a server does not run the conditional commands; releasing and extending by scripts",
				zap.String("event", "conditional_commands_off"), zap.Error(err))
			m.recheckConditional()
		}
	}
	return true
}

// conditionalRecheck is how long after a reply turned the conditional
// commands off the Manager first reads the masters' command tables again,
// in nanoseconds; each look that finds them still missing doubles it, up
// to conditionalRecheckMax.
var conditionalRecheck atomic.Int64

func init() { conditionalRecheck.Store(int64(30 * time.Second)) }

const conditionalRecheckMax = 10 * time.Minute

// recheckConditional looks again, on a goroutine of the transport's that
// ends at Close and that Close waits for, at every master's command table
// (the failover to an older replica may be undone, the upgrade finished):
// where every master runs the commands again, they come back on, with a
// log line.
func (m *Manager) recheckConditional() {
	m.tr.Go(func() {
		wait := time.Duration(conditionalRecheck.Load())
		t := time.NewTimer(wait)
		defer t.Stop()
		for {
			select {
			case <-m.closing:
				return
			case <-t.C:
			}
			if m.conditionalEverywhere() {
				m.conditional.Store(true)
				m.log.Info("every server runs the conditional commands again; releasing and extending with them",
					zap.String("event", "conditional_commands_on"))
				return
			}
			wait = min(2*wait, conditionalRecheckMax)
			t.Reset(wait)
		}
	})
}

// conditionalEverywhere reports whether every master runs the conditional
// commands, as their command tables say, within DefaultStartup; an error
// counts as no.
func (m *Manager) conditionalEverywhere() bool {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultStartup)
	defer cancel()
	all := true
	var mu sync.Mutex
	err := m.tr.EachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		has, err := conditionalCommands(ctx, c)
		mu.Lock()
		all = all && has
		mu.Unlock()
		return err
	})
	return err == nil && all
}

// conditionalCommands reports whether the server c talks to runs DELIFEQ
// and SET ... IFEQ, as its command table says (COMMAND INFO, COMMAND
// DOCS): a renamed or disabled command is absent there, whatever the
// server's version.
func conditionalCommands(ctx context.Context, c *redis.Client) (bool, error) {
	info, err := c.Do(ctx, "command", "info", "delifeq").Slice()
	if transport.IsReply(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if len(info) != 1 || info[0] == nil {
		return false, nil
	}
	docs, err := c.Do(ctx, "command", "docs", "set").Result()
	if transport.IsReply(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return mentions(docs, "ifeq"), nil
}

// mentions reports whether reply (a COMMAND DOCS reply, RESP2 or RESP3)
// holds the string word anywhere, in any case.
func mentions(reply any, word string) bool {
	switch v := reply.(type) {
	case string:
		return strings.EqualFold(v, word)
	case []any:
		for _, x := range v {
			if mentions(x, word) {
				return true
			}
		}
	case map[any]any:
		for k, x := range v {
			if mentions(k, word) || mentions(x, word) {
				return true
			}
		}
	case map[string]any:
		for k, x := range v {
			if strings.EqualFold(k, word) || mentions(x, word) {
				return true
			}
		}
	}
	return false
}
