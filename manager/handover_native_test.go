package manager_test

import (
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// The release and extend of a lock handed over from Redis's queue (its key
// holds its token with the queued mark) answer in the conditional commands
// (handover_native.go, on Valkey 9 and Redis 8) what the scripts answer, case by case:
// held with nobody queued, expired, held by another token, force-released,
// a key of another type, a waiter queued (handed the lock), the key
// expired with a waiter queued (nothing left without an expiry), a key of
// another type with a waiter queued (the entry stays queued), a fencing
// waiter queued (handed the lock with a fence, by the script), and junk
// and a dead entry ahead of a waiter (dropped). On Valkey 9 and Redis 8
// the test also checks what the default Manager's release sends in each
// case (hand_on.lua, then the conditional delete or release.lua as its
// reply says); on Redis 7 both sides run release.lua.
func TestRealNativeHandOverAnswersAsTheScript(t *testing.T) {
	for _, tg := range []testenv.Target{testenv.Targets()[0], testenv.Targets()[2]} {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := ctxT(t)
			p := newNativeAndScript(t, tg, "handed")
			admin, h := p.admin, p.h
			// holder hands each lock over; waiter queues behind it.
			holder := newManager(t, tg.Client(t), manager.WithKeyPrefix(p.prefix), manager.WithOwner("holder"), manager.WithConditionalCommands(false))
			waiter := newManager(t, tg.Client(t), manager.WithKeyPrefix(p.prefix), manager.WithOwner("waiter"))

			// queueWaiter starts waiter's Acquire of res (fencing or not)
			// and waits until its entry is queued behind what is queued
			// already (n entries); the channel gets the lock's fence or
			// error once it is released.
			queueWaiter := func(t *testing.T, l *manager.Lock, res string, fencing bool, n int64) <-chan string {
				got := make(chan string, 1)
				go func() {
					wl, err := waiter.Acquire(ctx, res, manager.WithFencing(fencing))
					if err != nil {
						got <- "waiter: " + err.Error()
						return
					}
					fence := wl.Fence()
					if err := wl.Release(ctx); err != nil {
						got <- "waiter's release: " + err.Error()
						return
					}
					got <- "fence " + strconv.FormatBool(fence > 0)
				}()
				eventually(t, 10*time.Second, "the waiter queued", func() bool { return queueLen(t, admin, l.Key()) == n+1 })
				return got
			}
			qkey := func(l *manager.Lock) string { return sharding.QueueKey(l.Key()) }
			type spoiler func(t *testing.T, m *manager.Manager, l *manager.Lock) (after func() string)
			none := func() string { return "" }
			cases := []struct {
				name  string
				spoil spoiler
			}{
				{"held", func(*testing.T, *manager.Manager, *manager.Lock) func() string { return none }},
				{"expired", func(t *testing.T, _ *manager.Manager, l *manager.Lock) func() string {
					if err := admin.Del(ctx, l.Key()).Err(); err != nil {
						t.Fatal(err)
					}
					return none
				}},
				{"another token", func(t *testing.T, _ *manager.Manager, l *manager.Lock) func() string {
					if err := admin.Set(ctx, l.Key(), "sl1.someone-else", time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
					return none
				}},
				{"force-released", func(t *testing.T, m *manager.Manager, l *manager.Lock) func() string {
					if err := m.ForceRelease(ctx, l.Resource(), "test"); err != nil {
						t.Fatal(err)
					}
					return none
				}},
				{"another type", func(t *testing.T, _ *manager.Manager, l *manager.Lock) func() string {
					replaceWithHash(t, ctx, admin, l.Key())
					return none
				}},
				{"waiter queued", func(t *testing.T, _ *manager.Manager, l *manager.Lock) func() string {
					got := queueWaiter(t, l, l.Resource(), false, 0)
					return func() string { return <-got }
				}},
				{"expired, waiter queued", func(t *testing.T, _ *manager.Manager, l *manager.Lock) func() string {
					got := queueWaiter(t, l, l.Resource(), false, 0)
					if err := admin.Del(ctx, l.Key()).Err(); err != nil {
						t.Fatal(err)
					}
					return func() string {
						// Nothing the release leaves may lack an expiry.
						state := "queue expires"
						if admin.PTTL(ctx, qkey(l)).Val() == -1 {
							state = "queue without expiry"
						}
						return state + ", " + <-got
					}
				}},
				{"another type, waiter queued", func(t *testing.T, _ *manager.Manager, l *manager.Lock) func() string {
					got := queueWaiter(t, l, l.Resource(), false, 0)
					replaceWithHash(t, ctx, admin, l.Key())
					return func() string {
						// The entry is still queued; the waiter takes the
						// key once it is gone.
						state := fmt.Sprintf("%d queued", admin.LLen(ctx, qkey(l)).Val())
						if err := admin.Del(ctx, l.Key()).Err(); err != nil {
							t.Fatal(err)
						}
						return state + ", " + <-got
					}
				}},
				{"fencing waiter queued", func(t *testing.T, _ *manager.Manager, l *manager.Lock) func() string {
					got := queueWaiter(t, l, l.Resource(), true, 0)
					return func() string { return <-got }
				}},
				{"junk and a dead entry first", func(t *testing.T, _ *manager.Manager, l *manager.Lock) func() string {
					dead := fmt.Sprintf("%d:1000:0:%s", time.Now().Add(-time.Second).UnixMilli(), "sl1.1.AAAAAAAAAAAAAAAAAAAAAA.gone")
					if err := admin.RPush(ctx, qkey(l), "junk", dead).Err(); err != nil {
						t.Fatal(err)
					}
					if err := admin.PExpire(ctx, qkey(l), time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
					got := queueWaiter(t, l, l.Resource(), false, 2)
					return func() string {
						return <-got + fmt.Sprintf(", %d left queued", admin.LLen(ctx, qkey(l)).Val())
					}
				}},
			}
			type outcome struct{ release, extend, after string }
			// sent is what the native side's release sent, by command.
			var sent map[string]int
			run := func(m *manager.Manager, side, name string, spoil spoiler) outcome {
				var o outcome
				for _, op := range []string{"release", "extend"} {
					res := side + ":" + name + ":" + op
					hl, err := holder.TryAcquire(ctx, res)
					if err != nil {
						t.Fatal(err)
					}
					l := handOver(t, ctx, admin, hl, m, res).l
					// The lock came on the claim lease: its watchdog
					// confirms it (an EVALSHA) about 50 ms later. Let that
					// happen first, so it never falls among the
					// release's commands counted below.
					eventually(t, 5*time.Second, "the claim lease confirmed", func() bool {
						return admin.PTTL(ctx, l.Key()).Val() > scripts.ClaimLease
					})
					after := spoil(t, m, l)
					if op == "release" {
						h.reset()
						o.release = errClass(l.Release(ctx))
						if m == p.native {
							sent = h.snapshot()
						}
						o.after = after()
					} else {
						o.extend = errClass(l.Extend(ctx, time.Minute))
						_ = l.Release(ctx)
						after()
					}
				}
				return o
			}
			// Where the server has the commands, what the native release
			// sends per case: hand_on.lua (EVALSHA) first, which hands the
			// lock over in one call; an empty queue's conditional delete
			// (del) and "free"; release.lua where a reply says the key is
			// not as expected, or for a fencing waiter (put back).
			del := condDel()
			nativeSent := map[string]map[string]int{
				"held":                        {"evalsha": 1, del: 1, "spublish": 1},
				"expired":                     {"evalsha": 2, del: 1},
				"another token":               {"evalsha": 2, del: 1},
				"force-released":              {"evalsha": 2, del: 1, "get": 1}, // the GET reads who and why
				"another type":                {"evalsha": 2, del: 1},
				"waiter queued":               {"evalsha": 1},
				"expired, waiter queued":      {"evalsha": 2},
				"another type, waiter queued": {"evalsha": 2},
				"fencing waiter queued":       {"evalsha": 2},
				"junk and a dead entry first": {"evalsha": 1},
			}
			for _, c := range cases {
				h.reset()
				got, want := run(p.native, "n", c.name, c.spoil), run(p.script, "s", c.name, c.spoil)
				if got != want {
					t.Errorf("%s: conditional commands answered %+v, the scripts %+v", c.name, got, want)
				}
				if onConditional() && !maps.Equal(sent, nativeSent[c.name]) {
					t.Errorf("%s: the native release sent %v, want %v", c.name, sent, nativeSent[c.name])
				}
				if !onConditional() && (sent["evalsha"] != 1 || sent[del] != 0) {
					t.Errorf("%s, on Redis 7: the release sent %v, want release.lua only", c.name, sent)
				}
				switch c.name {
				case "held":
					if want != (outcome{"nil", "nil", ""}) {
						t.Errorf("held: %+v, want nil for both", want)
					}
				case "waiter queued", "junk and a dead entry first":
					if want.release != "nil" || want.after != "fence false"+map[bool]string{true: ", 0 left queued"}[c.name != "waiter queued"] {
						t.Errorf("%s: %+v, want a nil release and the waiter handed the lock", c.name, want)
					}
				case "fencing waiter queued":
					if want.release != "nil" || want.after != "fence true" {
						t.Errorf("%s: %+v, want a nil release and the waiter handed the lock with a fence", c.name, want)
					}
				}
			}
		})
	}
}
