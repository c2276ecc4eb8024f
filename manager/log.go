package manager

import (
	"context"

	"go.uber.org/zap"
)

func (m *Manager) fields(ctx context.Context, event string, l *Lock, extra ...zap.Field) []zap.Field {
	f := append(make([]zap.Field, 0, 8+len(extra)),
		zap.String("event", event),
		zap.String("resource", l.resource),
		zap.String("owner", m.cfg.owner),
		zap.String("token", redactToken(l.token)),
		zap.Duration("ttl", l.ttl),
	)
	if l.fence != 0 {
		f = append(f, zap.Uint64("fence", l.fence))
	}
	if id := m.traceID(ctx); id != "" {
		f = append(f, zap.String("trace_id", id))
	}
	return append(f, extra...)
}

// traceID reads ctx's trace id with WithTraceID's function. A function
// that panics gives no id: a log line must never panic a lock call, which
// may hold a lock by then.
func (m *Manager) traceID(ctx context.Context) (id string) {
	if m.cfg.traceID == nil || ctx == nil {
		return ""
	}
	defer func() {
		if recover() != nil {
			id = ""
		}
	}()
	return m.cfg.traceID(ctx)
}
