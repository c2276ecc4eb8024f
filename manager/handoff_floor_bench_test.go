package manager_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
)

// handoffFloorMode is BenchmarkContendedHandoff's floor of an announced
// hand-over (managers=16/floor, processes=16/floor): no lock library, no
// queue to keep. 16 participants (goroutines of one process, each with a
// client of its own, or processes) pass the resource round-robin, in a
// fixed order that every one of them knows, each holding it 1 ms and
// handing it to the next by one script that sets the key to the next
// participant's value and publishes on its channel: one round trip, one
// replicated write and one announcement, which is the least a hand-over
// announced to a waiter costs. It checks nothing, so it is not a lock: it
// shows what the machine and the server allow, the figure shardlock's
// hand-over is to be read against.
const handoffFloorMode = "floor"

// handoffFloorScript hands the floor's key to the next participant:
// KEYS[1] the key, KEYS[2] the next one's channel, ARGV[1] its value.
var handoffFloorScript = redis.NewScript(`redis.call('SET', KEYS[1], ARGV[1], 'PX', 5000)
redis.call('SPUBLISH', KEYS[2], '1')
return 1`)

// benchHandoffFloor runs the floor in this process, as managers=16 runs
// its managers: 16 goroutines, each with a cluster client and a
// subscription of its own.
func benchHandoffFloor(b *testing.B, addrs []string, admin *redis.ClusterClient, name string) {
	b.Run(name, func(b *testing.B) {
		const n = 16
		res := testenv.Unique("handoff")
		floors := make([]*handoffFloor, n)
		for i := range floors {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
			b.Cleanup(func() { _ = c.Close() })
			f, err := newHandoffFloor(c, handoffChildConfig{Addrs: addrs, Mode: handoffFloorMode, Index: i, Procs: n,
				Goroutines: 1, Resource: res, N: int64(b.N)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(f.close) // before its client's Close
			floors[i] = f
		}
		tallies := make([]handoffTally, n)
		servers := benchkit.ServersOf(b, admin)
		before := commandCalls(b, admin)
		b.ResetTimer()
		measured := benchkit.Measure(servers)
		var wg sync.WaitGroup
		for i, f := range floors {
			wg.Go(func() {
				if err := f.loop(&tallies[i]); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		measured(b, reportHandoff(b, admin, before, tallies)) // per acquisition
	})
}

// handoffFloor is one participant of a floor run: number c.Index of
// c.Procs (processes, or goroutines of one process), one goroutine.
type handoffFloor struct {
	c      *redis.ClusterClient
	ps     *redis.PubSub
	cfg    handoffChildConfig
	key    string
	rounds int64 // this participant's share of the run's acquisitions
}

// handoffFloorChannel is the channel on which participant i of a floor
// run hears that it holds the key of resource res (the key's slot).
func handoffFloorChannel(res string, i int) string { return fmt.Sprintf("{%s}:floor:%d", res, i) }

// newHandoffFloor subscribes participant cfg.Index of a floor run to its
// channel and loads the script.
func newHandoffFloor(c *redis.ClusterClient, cfg handoffChildConfig) (*handoffFloor, error) {
	if cfg.Goroutines != 1 || cfg.Procs < 2 {
		return nil, errors.New("the floor runs one goroutine in each of several participants")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &handoffFloor{c: c, cfg: cfg, key: "{" + cfg.Resource + "}",
		rounds: cfg.N / int64(cfg.Procs)}
	if int64(cfg.Index) < cfg.N%int64(cfg.Procs) {
		f.rounds++
	}
	f.ps = c.SSubscribe(ctx, handoffFloorChannel(cfg.Resource, cfg.Index))
	if _, err := f.ps.Receive(ctx); err != nil { // the subscription's confirmation
		_ = f.ps.Close()
		return nil, err
	}
	if err := handoffFloorScript.Load(ctx, c).Err(); err != nil {
		_ = f.ps.Close()
		return nil, err
	}
	return f, nil
}

func (f *handoffFloor) close() { _ = f.ps.Close() }

// loop is the participant's goroutine: it waits for its turn (number 0
// has the first at once), holds the key 1 ms and hands it on, recording
// as handoffLoop does.
func (f *handoffFloor) loop(t *handoffTally) error {
	next := (f.cfg.Index + 1) % f.cfg.Procs
	for k := range f.rounds {
		t0 := time.Now()
		if f.cfg.Index != 0 || k > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := f.ps.ReceiveTimeout(ctx, 10*time.Second)
			cancel()
			if err != nil {
				return err
			}
		}
		w := time.Since(t0)
		held := time.Now()
		time.Sleep(time.Millisecond)
		t.Held, t.Freed = append(t.Held, held.UnixNano()), append(t.Freed, time.Now().UnixNano())
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := handoffFloorScript.Run(ctx, f.c, []string{f.key, handoffFloorChannel(f.cfg.Resource, next)}, next).Err()
		t.Released = append(t.Released, time.Now().UnixNano())
		cancel()
		if err != nil {
			return err
		}
		t.Waits = append(t.Waits, w)
	}
	return nil
}
