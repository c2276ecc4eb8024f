package manager

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/transport"
)

// The Manager's use of the newer servers' commands (servercmds.go): which
// native kinds are on, the fallback to the scripts when a server stops
// answering them, and the later look that turns them on again.

// setServerCmds turns the native kinds on for what s says every master
// runs, as far as WithConditionalCommands allows: the conditional delete
// is DELIFEQ where every master runs it, else DELEX ... IFEQ. On a
// cluster, MSETEX counts only where every master routes it by its keys'
// slot (masterCmds).
func (m *Manager) setServerCmds(s serverCmds) {
	allowed := m.cfg.conditional == nil || *m.cfg.conditional
	m.delex.Store(!s.delifeq)
	m.conditional.Store(allowed && s.conditional())
	m.msetexTx.Store(s.msetexTx)
	m.msetex.Store(allowed && s.msetex)
}

// masterCmds is serverCommands of master c, where on a cluster MSETEX
// goes in a transaction unless c routes it by its keys' slot
// (msetexRoutes).
func (m *Manager) masterCmds(ctx context.Context, c *redis.Client) (serverCmds, error) {
	s, err := serverCommands(ctx, c)
	if err != nil || !s.msetex {
		return s, err
	}
	if cc := m.tr.Cluster(); cc != nil {
		routes, err := msetexRoutes(ctx, cc, c, m.cfg.prefix)
		if err != nil {
			s.msetex = false
		}
		s.msetexTx = s.msetex && !routes
		return s, err
	}
	return s, nil
}

// scriptAfter reports whether a native command's error is one the script
// form of the call answers in its own way: an error reply that is not
// transient (WRONGTYPE, an unknown command, no permission), or TRYAGAIN (a
// multi-key command during a migration, which the batch script's path
// takes key by key). An unknown command, or no permission, turns that
// command's family off for the Manager, with one log line, and looks at
// the masters again later (recheckServerCmds).
func (m *Manager) scriptAfter(err error, family *atomic.Bool) bool {
	if transport.IsTryAgain(err) {
		return true
	}
	if !transport.IsReply(err) || transport.IsTransient(err) {
		return false
	}
	if msg, _ := transport.ReplyMsg(err); strings.HasPrefix(msg, "ERR unknown command") || strings.HasPrefix(msg, "NOPERM") {
		if family.CompareAndSwap(true, false) {
			m.log.Warn("a server does not run the conditional commands; using the scripts",
				zap.String("event", "conditional_commands_off"), zap.Error(err))
			m.recheckServerCmds()
		}
	}
	return true
}

// condDel returns the command that deletes key if it holds val (1 when it
// did, 0 when it did not): DELIFEQ, or DELEX ... IFEQ (setServerCmds).
func (m *Manager) condDel(ctx context.Context, key string, val any) *redis.IntCmd {
	if m.delex.Load() {
		return redis.NewIntCmd(ctx, "delex", key, "ifeq", val)
	}
	return redis.NewIntCmd(ctx, "delifeq", key, val)
}

// serverCmdsRecheck is how long after a reply turned a family of commands
// off the Manager first reads the masters' command tables again, in
// nanoseconds; each look that finds them still missing doubles it, up to
// serverCmdsRecheckMax.
var serverCmdsRecheck atomic.Int64

func init() { serverCmdsRecheck.Store(int64(30 * time.Second)) }

const serverCmdsRecheckMax = 10 * time.Minute

// recheckServerCmds looks again, on a goroutine of the transport's that
// ends at Close and that Close waits for, at every master's command table
// (the failover to an older replica may be undone, the upgrade finished):
// once every master runs again what New found, the native kinds are on
// again, with a log line.
func (m *Manager) recheckServerCmds() {
	m.tr.Go(func() {
		wait := time.Duration(serverCmdsRecheck.Load())
		t := time.NewTimer(wait)
		defer t.Stop()
		for {
			select {
			case <-m.closing:
				return
			case <-t.C:
			}
			if s, ok := m.serverCmdsEverywhere(); ok && s.and(m.found) == m.found {
				m.setServerCmds(m.found)
				m.log.Info("every server runs the conditional commands again; using them",
					zap.String("event", "conditional_commands_on"))
				return
			}
			wait = min(2*wait, serverCmdsRecheckMax)
			t.Reset(wait)
		}
	})
}

// serverCmdsEverywhere reports what every master runs, within
// DefaultStartup; ok is false after an error.
func (m *Manager) serverCmdsEverywhere() (_ serverCmds, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultStartup)
	defer cancel()
	all := allServerCmds
	var mu sync.Mutex
	err := m.tr.EachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		s, err := m.masterCmds(ctx, c)
		mu.Lock()
		all = all.and(s)
		mu.Unlock()
		return err
	})
	return all, err == nil
}
