package manager

import (
	"context"
	"time"
)

// The one-call forms of a kind's release and extend, shared by the kinds
// whose one call is their pipelined call.

// releaseBy is lockKind.release by k's calls.
func releaseBy(k lockKind, m *Manager, ctx context.Context, l *Lock, entry string, local, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	c := k.releaseCall(l.scriptKeys(), l.args[:], entry, local)
	return k.releaseResult(l, m.tr.RunScript(ctx, m.cmd, c.Script, c.Keys, c.Args...), ambiguous, sentAt, validUntil)
}

// extendBy is lockKind.extend by k's call.
func extendBy(k lockKind, m *Manager, ctx context.Context, l *Lock, ttlMs string) (int64, error) {
	c := k.extendCall(l.scriptKeys(), l.args[0], ttlMs)
	return m.tr.RunScript(ctx, m.cmd, c.Script, c.Keys, c.Args...).Int64()
}
