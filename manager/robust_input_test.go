package manager_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/manager"
)

// nilStrategy is a user strategy whose nil pointer panics when asked.
type nilStrategy struct{ d time.Duration }

func (s *nilStrategy) NextBackoff(int) time.Duration { return s.d }

// Strategies that would panic inside Acquire are refused before any round
// trip, at New and per acquire.
func TestRetryStrategiesThatWouldPanicAreRefused(t *testing.T) {
	_, c := miniClient(t)
	hook := &faultHook{}
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false))
	ctx := ctxT(t)
	tests := []struct {
		name string
		give manager.RetryStrategy
	}{
		{"LimitRetry of nil", manager.LimitRetry(nil, 5)},
		{"typed nil RetryFunc", manager.RetryFunc(nil)},
		{"nil pointer strategy", (*nilStrategy)(nil)},
		{"LimitRetry of a typed nil", manager.LimitRetry(manager.RetryFunc(nil), 3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := manager.New(ctx, c, manager.WithRetry(tt.give)); !errors.Is(err, manager.ErrInvalidArgument) {
				t.Fatalf("New = %v, want ErrInvalidArgument", err)
			}
			before := hook.seen.Load()
			_, err := m.Acquire(ctx, "r", manager.WithRetry(tt.give))
			if !errors.Is(err, manager.ErrInvalidArgument) {
				t.Fatalf("Acquire = %v, want ErrInvalidArgument", err)
			}
			if n := hook.seen.Load() - before; n != 0 {
				t.Fatalf("sent %d commands", n)
			}
		})
	}
}

// Backoffs with extreme arguments never panic and never wrap negative
// (negative means "stop").
func TestBackoffsWithExtremeArguments(t *testing.T) {
	tests := []struct {
		name string
		give manager.RetryStrategy
	}{
		{"exponential 1ns..max", manager.ExponentialBackoff(1, math.MaxInt64)},
		{"exponential max..max", manager.ExponentialBackoff(math.MaxInt64, math.MaxInt64)},
		{"exponential max/2..max", manager.ExponentialBackoff(math.MaxInt64/2+1, math.MaxInt64)},
		{"linear max", manager.LinearBackoff(math.MaxInt64)},
		{"linear max/2", manager.LinearBackoff(math.MaxInt64/2 + 7)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for attempt := range 200 {
				if d := tt.give.NextBackoff(attempt); d <= 0 {
					t.Fatalf("attempt %d: %v, a wait that means stop", attempt, d)
				}
			}
		})
	}
	// In Acquire, they wait until the wait limit like any other strategy.
	_, c := miniClient(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	held, err := m.TryAcquire(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	for _, tt := range tests {
		_, err := m.Acquire(ctx, "busy", manager.WithRetry(tt.give), manager.WithWait(20*time.Millisecond))
		if !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("%s: Acquire = %v, want ErrNotAcquired", tt.name, err)
		}
	}
}

// New refuses a nil pointer of any client type with a typed error.
func TestNewRefusesTypedNilClients(t *testing.T) {
	tests := []struct {
		name string
		give redis.UniversalClient
	}{
		{"client", (*redis.Client)(nil)},
		{"cluster", (*redis.ClusterClient)(nil)},
		{"ring", (*redis.Ring)(nil)},
		{"auto-pipeliner", (*redis.AutoPipeliner)(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := manager.New(context.Background(), tt.give); !errors.Is(err, manager.ErrInvalidArgument) {
				t.Fatalf("New = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

// Close(nil) is refused without closing anything: the lock stays held and
// a later Close releases it.
func TestCloseNilContext(t *testing.T) {
	mr, c := miniClient(t)
	m, err := manager.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 testing the nil-context check
	if err := m.Close(nil); !errors.Is(err, manager.ErrInvalidArgument) { //nolint:staticcheck
		t.Fatalf("Close(nil) = %v", err)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatalf("Close = %v", err)
	}
	waitDone(t, l, 5*time.Second)
	if mr.Exists(l.Key()) {
		t.Fatal("the key is still there after Close")
	}
}

// A max hold too long to reach is no max hold: it does not fire at once.
func TestMaxHoldBeyondTheEndOfTime(t *testing.T) {
	tests := []struct {
		name string
		mgr  []manager.Option
		acq  []manager.AcquireOption
	}{
		{"WithMaxHold", []manager.Option{manager.WithMaxHold(math.MaxInt64)}, nil},
		{"WithMaxHold", nil, []manager.AcquireOption{manager.WithMaxHold(math.MaxInt64)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := miniClient(t)
			m := newManager(t, c, tt.mgr...)
			ctx := ctxT(t)
			l, err := m.TryAcquire(ctx, "x", tt.acq...)
			if err != nil {
				t.Fatal(err)
			}
			// A second lock with a short max hold: once the watchdog has
			// fired it, it has looked at every lock due before.
			probe, err := m.TryAcquire(ctx, "probe", manager.WithMaxHold(20*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			<-probe.Context().Done()
			if err := l.Context().Err(); err != nil {
				t.Fatalf("the lock's context ended: %v (%v)", err, context.Cause(l.Context()))
			}
		})
	}
}

// Input checks of the whole acquire family: each refused before any round
// trip with a typed error that says what is wrong.
func TestMoreBadInputMakesNoRoundTrip(t *testing.T) {
	_, c := miniClient(t)
	hook := &faultHook{}
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false))
	ctx := ctxT(t)
	long := strings.Repeat("r", manager.MaxResourceLen)
	tests := []struct {
		name string
		call func() error
		want string // in the message
	}{
		{"renew interval 1ns", func() error {
			_, err := manager.New(ctx, c, manager.WithRenewInterval(1))
			return err
		}, "renew interval"},
		{"renew interval below the floor", func() error {
			_, err := manager.New(ctx, c, manager.WithRenewInterval(manager.MinRenewInterval-1))
			return err
		}, "renew interval"},
		{"batch of one key twice", func() error {
			_, err := m.TryAcquireBatch(ctx, []string{"x", "{x}"})
			return err
		}, `"x" and "{x}" name the same lock`},
		{"multi of one key twice", func() error {
			_, err := m.TryAcquireMulti(ctx, []string{"y", "a", "{y}"})
			return err
		}, `"y" and "{y}" name the same lock`},
		{"batch duplicate", func() error {
			_, err := m.TryAcquireBatch(ctx, []string{"{g}:1", "{g}:1"})
			return err
		}, "appears twice"},
		{"large batch duplicate", func() error {
			res := make([]string, 40)
			for i := range res {
				res[i] = fmt.Sprintf("{g}:%d", i)
			}
			res[39] = res[7]
			_, err := m.TryAcquireBatch(ctx, res)
			return err
		}, `resource "{g}:7" appears twice`},
		{"large batch of one key twice", func() error {
			res := []string{"z"}
			for i := range 30 {
				res = append(res, fmt.Sprintf("{z}:%d", i))
			}
			_, err := m.TryAcquireBatch(ctx, append(res, "{z}"))
			return err
		}, `"z" and "{z}" name the same lock`},
		{"stripe of a 1024-byte resource", func() error {
			_, err := m.AcquireStripe(ctx, long, 4, "p")
			return err
		}, "1024 bytes, more than 1022"},
		{"permits of a 1024-byte resource", func() error {
			_, err := m.AcquireAny(ctx, long, 100)
			return err
		}, "1024 bytes, more than 1021"},
		{"zero permits", func() error { _, err := m.AcquireAny(ctx, "pool", 0); return err }, "permits"},
		{"too many stripes", func() error {
			_, err := m.AcquireStripe(ctx, "hot", manager.MaxStripes+1, "p")
			return err
		}, "stripes"},
		{"permits of a tagged resource", func() error {
			_, err := m.AcquireAny(ctx, "{pool}", 3)
			return err
		}, "permits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := hook.seen.Load()
			err := tt.call()
			if !errors.Is(err, manager.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an invalid-argument error saying %q", err, tt.want)
			}
			if n := hook.seen.Load() - before; n != 0 {
				t.Fatalf("sent %d commands", n)
			}
		})
	}
	if m, err := manager.New(ctx, c, manager.WithRenewInterval(manager.MinRenewInterval)); err != nil {
		t.Fatalf("the floor itself is refused: %v", err)
	} else {
		_ = m.Close(ctx)
	}
}

// One attempt without a wait is said one way, with a Try form: a wait limit
// of 0 is refused, by New and by every acquire, before any round trip.
func TestZeroWaitRefused(t *testing.T) {
	_, c := miniClient(t)
	ctx := ctxT(t)
	if _, err := manager.New(ctx, c, manager.WithWait(0)); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("New(WithWait(0)) = %v", err)
	}
	m := newManager(t, c)
	if _, err := m.Acquire(ctx, "a", manager.WithWait(0)); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("Acquire(WithWait(0)) = %v", err)
	}
	if _, err := m.AcquireMulti(ctx, []string{"a", "b"}, manager.WithWait(0)); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("AcquireMulti(WithWait(0)) = %v", err)
	}
	if _, err := m.AcquireRead(ctx, "a", manager.WithWait(-time.Second)); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("AcquireRead(WithWait(-1s)) = %v", err)
	}
}

// A nil *Manager, a zero Manager and a zero Lock return errors instead of
// panicking.
func TestZeroValuesAreSafe(t *testing.T) {
	ctx := context.Background()
	for name, m := range map[string]*manager.Manager{"nil": nil, "zero": {}} {
		t.Run(name+" manager", func(t *testing.T) {
			calls := map[string]func() error{
				"TryAcquire": func() error { _, err := m.TryAcquire(ctx, "r"); return err },
				"Acquire":    func() error { _, err := m.Acquire(ctx, "r"); return err },
				"TryAcquireBatch": func() error {
					_, err := m.TryAcquireBatch(ctx, []string{"r"})
					return err
				},
				"AcquireBatch": func() error { _, err := m.AcquireBatch(ctx, []string{"r"}); return err },
				"AcquireMulti": func() error { _, err := m.AcquireMulti(ctx, []string{"r"}); return err },
				"TryAcquireMulti": func() error {
					_, err := m.TryAcquireMulti(ctx, []string{"r"})
					return err
				},
				"AcquireStripe": func() error { _, err := m.AcquireStripe(ctx, "r", 2, "p"); return err },
				"AcquireAny":    func() error { _, err := m.AcquireAny(ctx, "r", 2); return err },
				"Do":            func() error { return m.Do(ctx, "r", func(context.Context) error { return nil }) },
				"Close":         func() error { return m.Close(ctx) },
			}
			for call, f := range calls {
				if err := f(); !errors.Is(err, manager.ErrInvalidArgument) {
					t.Errorf("%s = %v, want ErrInvalidArgument", call, err)
				}
			}
		})
	}
	t.Run("zero lock", func(t *testing.T) {
		assertNoLock(t, &manager.Lock{})
		ml := &manager.MultiLock{}
		if err := ml.Release(ctx); err != nil {
			t.Fatalf("zero MultiLock Release = %v", err)
		}
	})
	// Every exported method, called on a nil and a zero value with zero
	// arguments (a live context where one is taken), returns without a
	// panic; the Manager's answer an *InvalidArgumentError.
	for _, v := range []any{(*manager.Manager)(nil), &manager.Manager{}, (*manager.Lock)(nil), &manager.Lock{},
		(*manager.MultiLock)(nil), &manager.MultiLock{}, (*manager.Leadership)(nil), &manager.Leadership{}} {
		rv := reflect.ValueOf(v)
		name := fmt.Sprintf("%T", v)
		if rv.IsNil() {
			name = "nil " + name
		}
		for i := range rv.NumMethod() {
			method := rv.Type().Method(i).Name
			t.Run(name+"."+method, func(t *testing.T) {
				for _, out := range callWithZeroArgs(t, rv.Method(i)) {
					err, isErr := out.Interface().(error)
					if isErr && rv.Type() == reflect.TypeFor[*manager.Manager]() && !errors.Is(err, manager.ErrInvalidArgument) {
						t.Errorf("= %v, want ErrInvalidArgument", err)
					}
				}
			})
		}
	}
}

// callWithZeroArgs calls f with zero values (context.Background() for a
// context) and returns its results; a result that is an iterator (List's)
// is ranged over, its errors returned too.
func callWithZeroArgs(t *testing.T, f reflect.Value) []reflect.Value {
	t.Helper()
	ft := f.Type()
	n := ft.NumIn()
	if ft.IsVariadic() {
		n-- // no variadic arguments
	}
	args := make([]reflect.Value, n)
	for i := range n {
		if in := ft.In(i); in == reflect.TypeFor[context.Context]() {
			args[i] = reflect.ValueOf(context.Background())
		} else {
			args[i] = reflect.Zero(in)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("panic: %v", p)
		}
	}()
	outs := f.Call(args)
	var more []reflect.Value
	for _, out := range outs {
		if seq, ok := out.Interface().(iter.Seq2[manager.LockInfo, error]); ok {
			for _, err := range seq {
				more = append(more, reflect.ValueOf(&err).Elem())
			}
		}
	}
	return append(outs, more...)
}

// A client kind the Manager cannot route by (a Ring shards by its own
// hash, not by slot) is refused by New, before any round trip.
func TestNewRefusesUnsupportedClient(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	m, err := manager.New(context.Background(), ring)
	var ia *manager.InvalidArgumentError
	if m != nil || !errors.As(err, &ia) || ia.Arg != "client" {
		t.Fatalf("New(ring) = %v, %v", m, err)
	}
}

// Bad input fails with a typed error before any command reaches Redis.
func TestBadInputMakesNoRoundTrip(t *testing.T) {
	_, c := miniClient(t)
	hook := &faultHook{}
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false), manager.WithRenewInterval(time.Second))
	ctx := ctxT(t)
	held, err := m.TryAcquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	before := hook.seen.Load()
	tests := []struct {
		name string
		call func() error
	}{
		{"empty resource", func() error { _, err := m.TryAcquire(ctx, ""); return err }},
		{"resource too long", func() error {
			_, err := m.Acquire(ctx, strings.Repeat("r", manager.MaxResourceLen+1))
			return err
		}},
		{"resource with stray brace", func() error { _, err := m.TryAcquire(ctx, "a}b"); return err }},
		{"resource with reserved suffix", func() error { _, err := m.TryAcquire(ctx, "x:fence"); return err }},
		{"ttl too short", func() error {
			_, err := m.TryAcquire(ctx, "r", manager.WithTTL(time.Microsecond))
			return err
		}},
		{"ttl not above renew interval", func() error {
			_, err := m.Acquire(ctx, "r", manager.WithTTL(time.Second))
			return err
		}},
		{"negative wait", func() error { _, err := m.Acquire(ctx, "r", manager.WithWait(-1)); return err }},
		{"nil retry", func() error { _, err := m.Acquire(ctx, "r", manager.WithRetry(nil)); return err }},
		{"negative max hold", func() error {
			_, err := m.Acquire(ctx, "r", manager.WithMaxHold(-time.Second))
			return err
		}},
		{"nil context", func() error {
			//lint:ignore SA1012 testing the nil-context check
			_, err := m.TryAcquire(nil, "r") //nolint:staticcheck
			return err
		}},
		{"nil fn", func() error { return m.Do(ctx, "r", nil) }},
		{"extend ttl too long", func() error { return held.Extend(ctx, manager.MaxTTL+1) }},
		{"extend ttl not above renew interval", func() error { return held.Extend(ctx, time.Second) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var iae *manager.InvalidArgumentError
			if !errors.As(err, &iae) {
				t.Fatalf("got %v, want *InvalidArgumentError", err)
			}
		})
	}
	if n := hook.seen.Load() - before; n != 0 {
		t.Fatalf("bad input sent %d commands to Redis", n)
	}
}

func TestNilLockIsSafe(t *testing.T) {
	var l *manager.Lock
	assertNoLock(t, l)
	if l.Key() != "" || l.Token() != "" || l.Resource() != "" || l.Fence() != 0 || !l.AcquiredAt().IsZero() || l.Replicas() != 0 {
		t.Fatal("accessors of a nil lock return values")
	}
}

// assertNoLock checks that l, a nil or zero Lock, answers ErrNilLock and
// has ended, with no round trip and no panic.
func assertNoLock(t *testing.T, l *manager.Lock) {
	t.Helper()
	ctx := context.Background()
	if err := l.Release(ctx); !errors.Is(err, manager.ErrNilLock) {
		t.Fatalf("Release = %v", err)
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, manager.ErrNilLock) {
		t.Fatalf("Extend = %v", err)
	}
	if _, err := l.TTL(ctx); !errors.Is(err, manager.ErrNilLock) {
		t.Fatalf("TTL = %v", err)
	}
	if err := l.Forget(); !errors.Is(err, manager.ErrNilLock) {
		t.Fatalf("Forget = %v", err)
	}
	<-l.Done()
	<-l.Context().Done()
	if !errors.Is(l.Err(), manager.ErrNilLock) {
		t.Fatalf("Err = %v", l.Err())
	}
}
