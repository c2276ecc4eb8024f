package manager_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
)

// A callback that panics never leaves a lock behind: Do releases the lock
// and lets the panic go on, a trace-id function that panics only loses its
// id. Real standalone server.
func TestRealPanickingCallbacksLeaveNoLock(t *testing.T) {
	c := testenv.Standalone(t)
	ctx := ctxT(t)
	tests := []struct {
		name string
		opts []manager.Option
		call func(m *manager.Manager, res string)
	}{
		{"Do fn panics", nil, func(m *manager.Manager, res string) {
			_ = m.Do(ctx, res, func(context.Context) error { panic("boom") })
		}},
		{"Do fn panics after the lock is lost", nil, func(m *manager.Manager, res string) {
			_ = m.Do(ctx, res, func(ctx context.Context) error {
				c.Del(ctx, "shardlock:{"+res+"}")
				panic("boom")
			})
		}},
		{"trace id panics", []manager.Option{
			manager.WithTraceID(func(context.Context) string { panic("trace") }),
			manager.WithLogger(debugLogger()),
		}, func(m *manager.Manager, res string) {
			l, err := m.TryAcquire(ctx, res)
			if err != nil {
				t.Errorf("TryAcquire = %v", err)
				return
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release = %v", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newManager(t, c, tt.opts...)
			other := newManager(t, c)
			res := testenv.Unique("panic")
			var recovered any
			func() {
				defer func() { recovered = recover() }()
				tt.call(m, res)
			}()
			if strings.HasPrefix(tt.name, "Do") && recovered != "boom" {
				t.Fatalf("recovered %v, want the callback's panic", recovered)
			}
			if !strings.HasPrefix(tt.name, "Do") && recovered != nil {
				t.Fatalf("panicked: %v", recovered)
			}
			// At once, not after a TTL: the key is gone.
			if n := c.Exists(ctx, "shardlock:{"+res+"}").Val(); n != 0 {
				t.Fatal("the lock key is still there")
			}
			l, err := other.TryAcquire(ctx, res)
			if err != nil {
				t.Fatalf("another manager's TryAcquire = %v", err)
			}
			_ = l.Release(ctx)
		})
	}
}

// Class names that are not valid label values (not UTF-8, not printable,
// too long) are counted as "other" and never panic a lock call.
func TestRealClassNamesThatAreNotLabels(t *testing.T) {
	c := testenv.Standalone(t)
	ctx := ctxT(t)
	reg := prometheus.NewRegistry()
	mx, err := metrics.New(reg, metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The README's class function, fed resources that are not UTF-8.
	m := newManager(t, c, manager.WithMetrics(mx),
		manager.WithClassFunc(func(resource string) string { return strings.SplitN(resource, ":", 2)[0] }))
	tests := []struct {
		name     string
		resource string
		opts     []manager.AcquireOption
	}{
		{"class func, not UTF-8", "\xff:" + testenv.Unique("1"), nil},
		{"WithClass, not UTF-8", testenv.Unique("a"), []manager.AcquireOption{manager.WithClass("\xff")}},
		{"WithClass, control", testenv.Unique("b"), []manager.AcquireOption{manager.WithClass("a\x00b")}},
		{"WithClass, too long", testenv.Unique("c"), []manager.AcquireOption{manager.WithClass(strings.Repeat("x", 65))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := m.TryAcquire(ctx, tt.resource, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	if got := series(t, reg, metrics.AcquireAttemptsTotal, metrics.ClassOther); got != float64(len(tests)) {
		t.Fatalf("%s{lock_class=other} = %v, want %d", metrics.AcquireAttemptsTotal, got, len(tests))
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("gather: %v", err)
	}
}

// debugLogger logs at debug level to nowhere, so debug-only paths run.
func debugLogger() *zap.Logger {
	l, _ := observedLogger()
	return l
}
