package manager

import (
	"context"
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"go.uber.org/zap"
)

// orphan hands a token that may hold the target's keys to the reaper.
func (m *Manager) orphan(tg target, token string, deadline time.Time) {
	kind := tg.kind.perKey()
	for _, k := range tg.keys() {
		m.reap(k, token, kind, deadline)
	}
}

// reap hands a token that may hold key (a key of kind), until deadline,
// to the watchdog's reaper; after Close, when no reaper runs, it releases
// it once now (bounded by a second), best effort.
func (m *Manager) reap(key, token string, kind lockKind, deadline time.Time) {
	if m.sched.addOrphan(key, token, kind, deadline) {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), minTime(deadline, time.Now().Add(time.Second)))
	defer cancel()
	c := orphan{key: key, token: token, kind: kind}.releaseCall()
	_ = m.tr.RunScript(ctx, m.client, c.Script, c.Keys, c.Args...).Err()
}

// maxOrphans bounds the tokens kept for background release.
const maxOrphans = 10000

// releaseCall is the script call that releases o.
func (o orphan) releaseCall() transport.ScriptCall {
	return o.kind.releaseCall([]string{o.key}, []any{o.token}, "", false)
}

// addOrphan hands a token that may hold key, until deadline, to the
// reaper. Between stop and take the list still grows, for Close to release:
// an exchange that settles late (Close waits for those) may leave a token
// whose attempt is still on its way, and Close releases the list only once
// that has had its reply. It returns false once Close has taken the list,
// and nothing would run it again.
func (s *scheduler) addOrphan(key, token string, kind lockKind, deadline time.Time) bool {
	if !time.Now().Before(deadline) {
		return true // nothing left to release
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.taken {
		return false
	}
	if len(s.orphans) >= maxOrphans {
		s.log.Warn("too many orphaned lock tokens; dropping the oldest", zap.String("event", "orphan_dropped"))
		s.orphans = s.orphans[1:]
	}
	s.orphans = append(s.orphans, orphan{key: key, token: token, kind: kind, deadline: deadline, next: time.Now()})
	s.poke()
	return true
}

func (m *Manager) orphanResult(o orphan, c transport.ScriptCall) {
	code, _, err := parseRelease(c.Cmd.Result())
	if err == nil && code != scripts.Gone && code != scripts.NotOurs {
		return // released, or handed over
	}
	// Gone or someone else's: the delayed attempt may still land, so look
	// again until the deadline, backing off.
	o.tries++
	o.next = time.Now().Add(transport.TransientBackoff(o.tries + 2))
	if !o.next.Before(o.deadline) {
		return
	}
	m.sched.mu.Lock()
	m.sched.orphans = append(m.sched.orphans, o) // after stop, Close releases what is left
	m.sched.wakeByLocked(monoOf(o.next))
	m.sched.mu.Unlock()
}
