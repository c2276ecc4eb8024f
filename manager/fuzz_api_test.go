package manager_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// fuzzInput reads a fuzzer's bytes as small choices; past the end every
// choice is 0.
type fuzzInput struct {
	b []byte
	s []string
}

func (in *fuzzInput) byte() byte {
	if len(in.b) == 0 {
		return 0
	}
	v := in.b[0]
	in.b = in.b[1:]
	return v
}

func (in *fuzzInput) pick(n int) int { return int(in.byte()) % n }

// duration picks from durations that matter at the edges.
func (in *fuzzInput) duration() time.Duration {
	ds := []time.Duration{0, -1, 1, time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond,
		50 * time.Millisecond, time.Second, 3 * time.Second, manager.MaxTTL, manager.MaxTTL + 1, math.MaxInt64, math.MinInt64}
	return ds[in.pick(len(ds))]
}

func (in *fuzzInput) resource() string {
	if len(in.s) > 0 && in.pick(3) == 0 {
		return in.s[in.pick(len(in.s))]
	}
	rs := []string{"r", "{r}", "x", "{g}:a", "{g}:b", "", "a}b", "x:fence", "\xff", "中文", "{}", "{{a}}b",
		strings.Repeat("r", manager.MaxResourceLen), strings.Repeat("r", manager.MaxResourceLen+1)}
	return rs[in.pick(len(rs))]
}

func (in *fuzzInput) retry() manager.RetryStrategy {
	switch in.pick(8) {
	case 0:
		return nil
	case 1:
		return manager.NoRetry()
	case 2:
		return manager.LinearBackoff(in.duration())
	case 3:
		return manager.ExponentialBackoff(in.duration(), in.duration())
	case 4:
		return manager.LimitRetry(manager.LinearBackoff(in.duration()), in.pick(5)-1)
	case 5:
		return manager.LimitRetry(nil, 3)
	case 6:
		return manager.RetryFunc(nil)
	}
	return manager.DefaultRetry()
}

// acquireOptions picks per-acquire options; waits stay short so a run is quick.
func (in *fuzzInput) acquireOptions() []manager.AcquireOption {
	var opts []manager.AcquireOption
	for range in.pick(4) {
		switch in.pick(8) {
		case 0:
			opts = append(opts, manager.WithTTL(in.duration()))
		case 1:
			opts = append(opts, manager.WithWait(min(in.duration(), 20*time.Millisecond)))
		case 2:
			opts = append(opts, manager.WithRetry(in.retry()))
		case 3:
			opts = append(opts, manager.WithFencing(true))
		case 4:
			opts = append(opts, manager.WithMaxHold(in.duration()))
		case 5:
			opts = append(opts, manager.WithWatchdog(in.pick(2) == 0))
		case 6:
			opts = append(opts, manager.WithClass(in.resource()))
		default:
			opts = append(opts, nil)
		}
	}
	return opts
}

// FuzzPublicAPI drives the manager's public API (every method of Manager,
// Lock, MultiLock and Leadership) with random options and inputs: a run
// never panics, every error for bad input is typed, and once the manager
// is closed no lock key is left behind, and every key it wrote has a TTL
// (fence counters and forced-release records expire on their own).
func FuzzPublicAPI(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{3, 3, 3, 200, 7, 1, 9, 9, 2, 255, 4, 4, 4, 0, 1})
	f.Add([]byte{9, 0, 9, 1, 9, 2, 9, 3, 9, 4, 9, 5, 9, 6, 9, 7, 9, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		defer c.Close()
		in := &fuzzInput{b: data}
		opts := []manager.Option{manager.WithStartupCheck(false)}
		for range in.pick(3) {
			switch in.pick(6) {
			case 0:
				opts = append(opts, manager.WithTTL(in.duration()))
			case 1:
				opts = append(opts, manager.WithWait(min(in.duration(), 20*time.Millisecond)))
			case 2:
				opts = append(opts, manager.WithRetry(in.retry()))
			case 3:
				opts = append(opts, manager.WithFencing(in.pick(2) == 0))
			case 4:
				opts = append(opts, manager.WithMaxHold(in.duration()))
			case 5:
				opts = append(opts, manager.WithRenewInterval(in.duration()))
			}
		}
		m, err := manager.New(context.Background(), c, opts...)
		if err != nil {
			if !errors.Is(err, manager.ErrInvalidArgument) {
				t.Fatalf("New = %v", err)
			}
			return
		}
		ctx := context.Background()
		var locks []*manager.Lock
		var multis []*manager.MultiLock
		var leads []*manager.Leadership
		lostDo := map[string]bool{}    // lock keys of Do calls whose lock was lost
		forgotten := map[string]bool{} // tokens of locks handed on with Forget: their keys stay until their TTL
		check := func(op string, err error) {
			if err != nil && !errors.Is(err, manager.ErrInvalidArgument) && !errors.Is(err, manager.ErrNotAcquired) &&
				!errors.Is(err, manager.ErrLockLost) && !errors.Is(err, manager.ErrNotHeld) && !errors.Is(err, manager.ErrExpired) &&
				!errors.Is(err, manager.ErrReleased) && !errors.Is(err, context.DeadlineExceeded) &&
				!errors.Is(err, manager.ErrNoLeader) && !errors.Is(err, manager.ErrForgotten) && !errors.Is(err, manager.ErrNilLock) &&
				!errors.Is(err, manager.ErrCrossSlot) {
				t.Fatalf("%s: unexpected error %v", op, err)
			}
		}
		for step := 0; step < 12 && len(in.b) > 0; step++ {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			switch in.pick(24) {
			case 0:
				l, err := m.TryAcquire(cctx, in.resource(), in.acquireOptions()...)
				check("TryAcquire", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 1:
				l, err := m.Acquire(cctx, in.resource(), append(in.acquireOptions(), manager.WithWait(10*time.Millisecond))...)
				check("Acquire", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 2:
				l, err := m.TryAcquireBatch(cctx, []string{in.resource(), in.resource()}, in.acquireOptions()...)
				check("TryAcquireBatch", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 3:
				ml, err := m.AcquireMulti(cctx, []string{in.resource(), in.resource(), in.resource()},
					append(in.acquireOptions(), manager.WithWait(10*time.Millisecond))...)
				check("AcquireMulti", err)
				if err == nil {
					multis = append(multis, ml)
				}
			case 4:
				l, err := m.AcquireAny(cctx, in.resource(), in.pick(5), append(in.acquireOptions(), manager.WithWait(10*time.Millisecond))...)
				check("AcquireAny", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 5:
				l, err := m.AcquireStripe(cctx, in.resource(), in.pick(5), in.resource(), append(in.acquireOptions(), manager.WithWait(10*time.Millisecond))...)
				check("AcquireStripe", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 6:
				panics := in.pick(2) == 0
				res := in.resource()
				func() {
					defer func() { _ = recover() }()
					err := m.Do(cctx, res, func(context.Context) error {
						if panics {
							panic("fuzz")
						}
						return nil
					}, append(in.acquireOptions(), manager.WithWait(10*time.Millisecond))...)
					check("Do", err)
					if errors.Is(err, manager.ErrLockLost) {
						k, _ := sharding.LockKey(sharding.DefaultPrefix, res)
						lostDo[k] = true
					}
				}()
			case 7:
				if len(locks) > 0 {
					check("Extend", locks[in.pick(len(locks))].Extend(cctx, in.duration()))
				}
			case 8:
				if len(locks) > 0 {
					_, err := locks[in.pick(len(locks))].TTL(cctx)
					check("TTL", err)
				}
			case 9:
				if len(locks) > 0 {
					check("Release", locks[in.pick(len(locks))].Release(cctx))
				} else if len(multis) > 0 {
					check("MultiLock.Release", multis[in.pick(len(multis))].Release(cctx))
				}
			case 10:
				read := in.pick(2) == 0
				var l *manager.Lock
				var err error
				if read {
					l, err = m.TryAcquireRead(cctx, in.resource(), in.acquireOptions()...)
				} else {
					l, err = m.TryAcquireWrite(cctx, in.resource(), in.acquireOptions()...)
				}
				check("TryAcquireRead/Write", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 11:
				wait := append(in.acquireOptions(), manager.WithWait(10*time.Millisecond))
				var l *manager.Lock
				var err error
				if in.pick(2) == 0 {
					l, err = m.AcquireRead(cctx, in.resource(), wait...)
				} else {
					l, err = m.AcquireWrite(cctx, in.resource(), wait...)
				}
				check("AcquireRead/Write", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 12:
				wctx, wcancel := context.WithTimeout(cctx, 20*time.Millisecond)
				ld, err := m.Campaign(wctx, in.resource(), in.acquireOptions()...)
				wcancel()
				check("Campaign", err)
				if err == nil {
					leads = append(leads, ld)
				}
			case 13:
				if len(leads) > 0 {
					ld := leads[in.pick(len(leads))]
					_, _, _, _ = ld.Name(), ld.Term(), ld.Done(), ld.Context()
					check("Leadership.Err", ld.Err())
					check("Resign", ld.Resign(cctx))
				}
			case 14:
				_, err := m.Leader(cctx, in.resource())
				check("Leader", err)
			case 15:
				octx, ocancel := context.WithTimeout(cctx, 20*time.Millisecond)
				ch, err := m.Observe(octx, in.resource())
				check("Observe", err)
				if err == nil {
					for range ch { // closed when octx ends
					}
				}
				ocancel()
			case 16:
				_, err := m.Inspect(cctx, in.resource())
				check("Inspect", err)
			case 17:
				n := 0
				for _, err := range m.List(cctx, manager.ListOptions{Prefix: in.resource(), Count: int64(in.pick(3))}) {
					check("List", err)
					if n++; n > 100 {
						break
					}
				}
			case 18:
				check("ForceRelease", m.ForceRelease(cctx, in.resource(), in.resource()))
			case 19:
				token := in.resource()
				if len(locks) > 0 && in.pick(2) == 0 {
					token = locks[in.pick(len(locks))].Token()
				}
				l, err := m.Resume(cctx, in.resource(), token, in.acquireOptions()...)
				check("Resume", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 20:
				if len(locks) > 0 {
					l := locks[in.pick(len(locks))]
					if err := l.Forget(); err == nil {
						forgotten[l.Token()] = true
					} else {
						check("Forget", err)
					}
				}
			case 21:
				var l *manager.Lock
				var err error
				switch in.pick(4) {
				case 0:
					l, err = m.TryAcquireAny(cctx, in.resource(), in.pick(5), in.acquireOptions()...)
				case 1:
					l, err = m.TryAcquireStripe(cctx, in.resource(), in.pick(5), in.resource(), in.acquireOptions()...)
				default:
					l, err = m.AcquireBatch(cctx, []string{in.resource(), in.resource()}, append(in.acquireOptions(), manager.WithWait(10*time.Millisecond))...)
				}
				check("TryAcquireAny/TryAcquireStripe/AcquireBatch", err)
				if err == nil {
					locks = append(locks, l)
				}
			case 22:
				ml, err := m.TryAcquireMulti(cctx, []string{in.resource(), in.resource()}, in.acquireOptions()...)
				check("TryAcquireMulti", err)
				if err == nil {
					multis = append(multis, ml)
				}
			case 23:
				if len(multis) > 0 {
					ml := multis[in.pick(len(multis))]
					_, _, _, _, _ = ml.Locks(), ml.Resources(), ml.Keys(), ml.Fences(), ml.Done()
					_, _ = ml.Context(), ml.Err()
					check("MultiLock.Extend", ml.Extend(cctx, in.duration()))
					_, err := ml.TTL(cctx)
					check("MultiLock.TTL", err)
				} else if len(locks) > 0 {
					l := locks[in.pick(len(locks))]
					_, _, _, _, _, _ = l.Resource(), l.Key(), l.Token(), l.Fence(), l.AcquiredAt(), l.Replicas()
					_, _, _ = l.Resources(), l.Keys(), l.Fences()
				}
			}
			cancel()
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := m.Close(cctx); err != nil {
			t.Fatalf("Close = %v", err)
		}
		// Redis expires keys by itself; miniredis only when told to. A lock
		// whose validity ran out before a renewal came is lost, and not
		// released: its key expires. So does a key of a TTL of a few
		// milliseconds (10 ms at most, the shortest TTLs picked) whose
		// attempt the caller gave up on: its release is tried until that
		// TTL would have run out, and no longer. Neither is a leak; any
		// other key is.
		lost := map[string]bool{}
		all := locks
		for _, ml := range multis {
			all = append(all, ml.Locks()...)
		}
		for _, l := range all {
			if errors.Is(l.Err(), manager.ErrLockLost) {
				lost[l.Token()] = true
			}
		}
		for _, l := range leads {
			if errors.Is(l.Err(), manager.ErrLockLost) {
				k, _ := sharding.LockKey(sharding.DefaultPrefix, "election:"+l.Name())
				lostDo[k] = true
			}
		}
		for _, k := range mr.Keys() {
			if sharding.IsHelperKey(k) { // fence counters, queues and forced records expire on their own
				if mr.TTL(k) <= 0 {
					t.Fatalf("helper key %q has no TTL", k)
				}
				continue
			}
			v, _ := mr.Get(k)
			toks := []string{strings.TrimSuffix(v, sharding.QueuedMark)}
			if mr.Type(k) == "hash" { // a read-write lock: its writer's and readers' tokens
				toks = []string{mr.HGet(k, "w")}
				fields, _ := mr.HKeys(k)
				for _, f := range fields {
					if r, ok := strings.CutPrefix(f, "r:"); ok {
						toks = append(toks, r)
					}
				}
			}
			if lostDo[k] || slices.ContainsFunc(toks, func(tok string) bool { return lost[tok] || forgotten[tok] && mr.TTL(k) > 0 }) {
				continue
			}
			if ttl := mr.TTL(k); ttl > 0 && ttl <= 10*time.Millisecond {
				continue
			}
			t.Fatalf("key %q (%q, TTL %v) left behind after Close", k, v, mr.TTL(k))
		}
	})
}
