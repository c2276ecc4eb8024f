package faults

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/shardlock/shardlock/internal/slotmap"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// go-redis starts a dial prober when every dial to a node fails (here: a
// killed master); it notices the closed pool only after its next 1 s sleep,
// so it may outlive the test by up to a second. It is go-redis's, bounded,
// and not shardlock's to stop.
// migrations is how many times the slot migration case runs, each on a
// slot of its own: CI runs it once; scripts/migrations.sh runs it 20 times
// in a row.
var migrations = flag.Int("migrations", 1, "runs of the slot migration case")

// migrateKeys and migratePause shape the slot migration case's key moves:
// how many keys each MIGRATE moves and how long it pauses between them.
// One MIGRATE of the whole slot is the default; redis-cli --cluster
// reshard moves 10 keys per MIGRATE.
var (
	migrateKeys  = flag.Int("migrate.keys", 100, "keys per MIGRATE in the slot migration case")
	migratePause = flag.Duration("migrate.pause", 0, "pause between MIGRATE calls in the slot migration case")
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec)) // a worker process of TestReshard
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

type section struct {
	resource   string
	fence      uint64
	start, end time.Time
	read       bool // a read-write lock's reader: may overlap other readers
}

// workload runs managers x workers goroutines contending for resources
// with fencing and the watchdog on (or the defaults: see defaults), until ctx ends, and records every
// critical section. A resource with commas is a batch lock of its parts;
// one that starts with "rw:" is a read-write lock on the rest, taken by
// each goroutine as a reader three times in four and as a writer else;
// one that starts with "nf:" is an exclusive lock on the rest, taken
// without a fence.
// Errors other than the run's own deadline are collected.
type workload struct {
	mu       sync.Mutex
	sections []section
	errs     []error
	lost     int
	lostWhy  []string
	replies  map[string]int
	// goroutines: how many run the workload (managers x workers).
	goroutines int // error replies the managers' clients met, by first word
	// defaults: the managers use the library's defaults (no fencing, the
	// default retry strategy), with the workload's TTL.
	defaults bool
	start    chan struct{} // see started
}

// started returns a channel that run closes once it has made every manager
// (or failed to make one): a fault injected after it meets them all made,
// rather than a manager's startup check.
func (w *workload) started() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.start == nil {
		w.start = make(chan struct{})
	}
	return w.start
}

// replyHook counts the error replies a node client meets (before the
// cluster client follows a redirect or the manager retries).
type replyHook struct{ w *workload }

func (h replyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h replyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "client" {
			return err // the connection handshake: CLIENT SETINFO is newer than 7.0
		}
		seen := err // the reply error comes back here (cmd.Err() may be set later)
		if seen == nil {
			seen = cmd.Err()
		}
		h.w.sawReply(seen)
		return err // unchanged: what the client does next depends on it
	}
}
func (h replyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() != "client" {
				h.w.sawReply(c.Err())
			}
		}
		return err
	}
}

func (w *workload) sawReply(err error) {
	var re redis.Error
	if err == nil || errors.Is(err, redis.Nil) || !errors.As(err, &re) {
		return
	}
	word, _, _ := strings.Cut(err.Error(), " ")
	w.mu.Lock()
	if w.replies == nil {
		w.replies = map[string]int{}
	}
	w.replies[word]++
	w.mu.Unlock()
}

// saw returns how many error replies starting with word the run met.
func (w *workload) saw(word string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.replies[word]
}

func (w *workload) run(ctx context.Context, addrs, resources []string, managers, workers int) {
	w.goroutines = managers * workers
	var wg sync.WaitGroup
	// Every manager is made before any goroutine runs, so a fault that
	// waits for started meets all of them made.
	ms := make([]*manager.Manager, managers)
	for i := range managers {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		c.OnNewNode(func(n *redis.Client) { n.AddHook(replyHook{w}) })
		opts := []manager.Option{manager.WithTTL(3 * time.Second), manager.WithOwner(fmt.Sprintf("fault-%d", i))}
		if !w.defaults {
			opts = append(opts, manager.WithFencing(true), manager.WithWait(30*time.Second),
				manager.WithRetry(manager.ExponentialBackoff(time.Millisecond, 50*time.Millisecond)))
		}
		m, err := manager.New(ctx, c, opts...)
		if err != nil {
			_ = c.Close()
			w.fail(fmt.Errorf("manager %d: %w", i, err))
			break
		}
		ms[i] = m
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = m.Close(cctx)
			_ = c.Close()
		}()
	}
	close(w.started())
	for _, m := range ms {
		if m == nil {
			break
		}
		for g := range workers {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					res := resources[g%len(resources)] // each resource contended by a goroutine of every manager
					var l *manager.Lock
					var err error
					rw, isRW := strings.CutPrefix(res, "rw:")
					read := isRW && i%4 != 0
					nf, unfenced := strings.CutPrefix(res, "nf:")
					switch {
					case unfenced:
						l, err = m.Acquire(ctx, nf, manager.WithFencing(false))
					case strings.Contains(res, ","): // a batch in one slot
						l, err = m.AcquireBatch(ctx, strings.Split(res, ","))
					case read:
						l, err = m.AcquireRead(ctx, rw)
					case isRW:
						l, err = m.AcquireWrite(ctx, rw)
					default:
						l, err = m.Acquire(ctx, res)
					}
					if err != nil {
						if ctx.Err() == nil {
							w.fail(fmt.Errorf("acquire %s: %w", res, err))
						}
						return
					}
					s := section{resource: res, fence: l.Fence(), start: time.Now(), read: read}
					time.Sleep(time.Millisecond)
					s.end = time.Now()
					lost := l.Err() != nil
					rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					rerr := l.Release(rctx)
					cancel()
					w.mu.Lock()
					if lost || errors.Is(rerr, manager.ErrLockLost) || errors.Is(rerr, manager.ErrNotHeld) || errors.Is(rerr, manager.ErrExpired) {
						w.lost++
						w.lostWhy = append(w.lostWhy, fmt.Sprintf("%s: Err %v, Release %v", res, l.Err(), rerr))
					} else {
						w.sections = append(w.sections, s)
						if rerr != nil {
							w.errs = append(w.errs, fmt.Errorf("release %s: %w", res, rerr))
						}
					}
					w.mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
}

func (w *workload) fail(err error) {
	w.mu.Lock()
	w.errs = append(w.errs, err)
	w.mu.Unlock()
}

// count returns how many critical sections w has recorded.
func (w *workload) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.sections)
}

// lossPolicy says which lost locks a fault may cost.
type lossPolicy int

const (
	// noLoss: no lock is lost.
	noLoss lossPolicy = iota
	// outageLoss: an outage longer than the claim lease may cost a lock
	// handed over from the queue just before it (a holder on the lease
	// cannot confirm it meanwhile): at most one per goroutine, each
	// reported to its holder; fences still rise.
	outageLoss
	// writeLoss: the fault may lose writes not yet replicated (kill -9 of
	// a master): locks may be lost and fences repeat.
	writeLoss
)

// check: no error, no overlap on a resource, lost locks and fences as
// policy allows.
func (w *workload) check(t *testing.T, policy lossPolicy) {
	t.Helper()
	for _, err := range w.errs {
		t.Error(err)
	}
	switch {
	case w.lost > 0 && policy == noLoss, w.lost > w.goroutines && policy == outageLoss:
		t.Errorf("%d locks lost: %v", w.lost, w.lostWhy)
	case w.lost > 0:
		t.Logf("locks lost, as the fault may cost: %v", w.lostWhy)
	}
	per := map[string][]section{}
	for _, s := range w.sections {
		per[s.resource] = append(per[s.resource], s)
	}
	for r, ss := range per {
		slices.SortFunc(ss, func(a, b section) int { return a.start.Compare(b.start) })
		var (
			lastEnd   time.Time // the latest end so far, and whether a reader's
			lastRead  bool
			lastFence uint64 // the last writer's
		)
		for i, s := range ss {
			if i > 0 && s.start.Before(lastEnd) && !(s.read && lastRead) {
				t.Errorf("%s: critical sections overlap", r)
			}
			if s.end.After(lastEnd) {
				lastEnd, lastRead = s.end, s.read
			}
			if s.read {
				continue
			}
			if lastFence > 0 && s.fence <= lastFence && policy != writeLoss {
				t.Errorf("%s: fence %d after %d", r, s.fence, lastFence)
			}
			lastFence = s.fence
		}
	}
	t.Logf("%d critical sections on %d resources, %d locks lost; error replies met and retried: %v; longest times without an acquisition: %v",
		len(w.sections), len(per), w.lost, w.replies, w.longestGap())
	if len(w.sections) < 50 {
		t.Errorf("only %d critical sections", len(w.sections))
	}
}

// longestGap returns, per resource, the longest time between two of its
// acquisitions, over the recorded critical sections.
func (w *workload) longestGap() map[string]time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	per := map[string][]time.Time{}
	for _, s := range w.sections {
		per[s.resource] = append(per[s.resource], s.start)
	}
	gaps := map[string]time.Duration{}
	for r, starts := range per {
		slices.SortFunc(starts, time.Time.Compare)
		for i := 1; i < len(starts); i++ {
			gaps[r] = max(gaps[r], starts[i].Sub(starts[i-1]))
		}
	}
	return gaps
}

// killNode kills the server pid (listening on port) with SIGKILL, and
// returns the function that restarts it and waits until the cluster is ok
// again.
func killNode(t *testing.T, addrs []string, pid, port string) (restart func()) {
	t.Helper()
	if err := exec.Command("kill", "-9", pid).Run(); err != nil {
		t.Fatal(err)
	}
	return func() {
		out, err := exec.Command("bash", "../../scripts/redis-test-env.sh", "restart", port).CombinedOutput()
		if err != nil {
			t.Errorf("restart %s: %v\n%s", port, err, out)
		}
		waitClusterOK(t, addrs, 60*time.Second)
	}
}

// masterOf returns the address of the master serving slot, and of one of its replicas.
func masterOf(t *testing.T, ctx context.Context, c *redis.ClusterClient, slot int) (master, replica string) {
	t.Helper()
	slots, err := slotmap.Read(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := slots.Of(slot); ok {
		if len(r.Replicas) < 1 {
			t.Fatalf("slot %d has no replica", slot)
		}
		return r.Master, r.Replicas[0]
	}
	t.Fatalf("slot %d unserved", slot)
	return "", ""
}

// resourcesOn returns n resources whose lock keys live on master addr.
func resourcesOn(t *testing.T, ctx context.Context, c *redis.ClusterClient, addr, prefix string, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n && i < 100000; i++ {
		r := fmt.Sprintf("%s-%d", prefix, i)
		key, _ := sharding.LockKey(sharding.DefaultPrefix, r)
		if m, _ := masterOf(t, ctx, c, sharding.Slot(key)); m == addr {
			out = append(out, r)
		}
	}
	return out
}

func node(addr string) *redis.Client { return redis.NewClient(&redis.Options{Addr: addr}) }

// awaitReplicaCounter waits up to 30 s (polling: a replica's apply has no
// signal to wait on) until the replica behind rep, a client whose
// connections are READONLY, serves the fence counter at fk at want or
// above.
func awaitReplicaCounter(t *testing.T, ctx context.Context, rep *redis.Client, fk string, want uint64) {
	t.Helper()
	var got uint64
	var err error
	for range 300 {
		if got, err = rep.Get(ctx, fk).Uint64(); err == nil && got >= want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the replica's fence counter is %d (%v), want %d", got, err, want)
}

// awaitSubscribers waits up to 2 s (polling) until the channel of the lock
// at key has want subscribers on the server at addr: every manager's
// waiters can hear its hand-overs there.
func awaitSubscribers(ctx context.Context, addr, key string, want int64) error {
	n := node(addr)
	defer n.Close()
	got := int64(-1)
	for i := 0; i < 200; i++ {
		v, err := n.Do(ctx, "pubsub", "shardnumsub", sharding.ChannelName(key)).Slice()
		if err == nil && len(v) == 2 {
			got, _ = v[1].(int64)
		}
		if got == want {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%d subscribers on %s, want %d", got, addr, want)
}

// otherMaster returns the address of a master other than not.
func otherMaster(t *testing.T, ctx context.Context, c *redis.ClusterClient, not string) string {
	t.Helper()
	slots, err := slotmap.Read(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range slots.Masters() {
		if a != not {
			return a
		}
	}
	t.Fatalf("no master other than %s", not)
	return ""
}

// replicasOf returns the replicas of the master at addr.
func replicasOf(t *testing.T, ctx context.Context, c *redis.ClusterClient, addr string) []string {
	t.Helper()
	slots, err := slotmap.Read(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range slots {
		if r.Master == addr {
			return r.Replicas
		}
	}
	t.Fatalf("%s serves no slot", addr)
	return nil
}

// pidOf returns the process id and port of the server at addr, started by
// scripts/redis-test-env.sh under dir.
func pidOf(t *testing.T, dir, addr string) (pid, port string) {
	t.Helper()
	port = addr[strings.LastIndexByte(addr, ':')+1:]
	b, err := os.ReadFile(filepath.Join(dir, port, "redis.pid"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b)), port
}

// waitClusterOK waits until every node of addrs reports cluster_state:ok
// and every slot range has a replica (a node restarted after a fault test
// takes a moment to rejoin as one).
func waitClusterOK(t *testing.T, addrs []string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok := true
		for _, a := range addrs {
			n := node(a)
			info, err := n.ClusterInfo(context.Background()).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok = false
			}
			slots, err := slotmap.Read(context.Background(), n)
			if err != nil {
				ok = false
			}
			for _, r := range slots {
				if r.Master == "" || len(r.Replicas) < 1 {
					ok = false
				}
			}
			_ = n.Close()
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not ok within %v", limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startMigration puts slot in IMPORTING on dst and MIGRATING on src.
func startMigration(ctx context.Context, src, dst *redis.Client, slot int) error {
	srcID, err := src.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		return err
	}
	dstID, err := dst.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		return err
	}
	if err := dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
		return err
	}
	return src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err()
}

// finishMigration moves slot's keys from src to dst (migrateKeys per
// MIGRATE, migratePause apart) and gives the slot to dst on every master.
func finishMigration(ctx context.Context, addrs []string, src, dst *redis.Client, slot int) error {
	return moveSlot(ctx, addrs, src, dst, slot, false)
}

// repairMigration finishes a migration that finishMigration could not,
// replacing keys the target has already, so that the cluster is whole
// again for the next test.
func repairMigration(t *testing.T, ctx context.Context, addrs []string, src, dst *redis.Client, slot int) {
	if err := moveSlot(ctx, addrs, src, dst, slot, true); err != nil {
		t.Errorf("repairing the migration of slot %d: %v", slot, err)
	}
}

// moveSlot is finishMigration, with MIGRATE's REPLACE when replace is set.
func moveSlot(ctx context.Context, addrs []string, src, dst *redis.Client, slot int, replace bool) error {
	dstID, err := dst.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		return err
	}
	host, port, _ := strings.Cut(dst.Options().Addr, ":")
	for range 100 {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, *migrateKeys).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000}
		if replace {
			args = append(args, "replace")
		}
		args = append(args, "keys")
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil && !strings.Contains(err.Error(), "NOKEY") {
			// Key by key, to name every key the target has already (no
			// lock call makes a second copy: any is a failure).
			var busy []string
			for _, k := range keys {
				e := src.Do(ctx, "migrate", host, port, k, 0, 5000).Err()
				if e != nil && strings.Contains(e.Error(), "BUSYKEY") {
					typ := src.Type(ctx, k).Val()
					busy = append(busy, k+"("+typ+")")
				}
			}
			if len(busy) > 0 {
				return fmt.Errorf("%w: busy: %q", err, busy)
			}
		}
		time.Sleep(*migratePause)
	}
	for _, a := range addrs {
		n := node(a)
		_ = n.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err() // replicas refuse; masters take it
		_ = n.Close()
	}
	return nil
}

func TestFaults(t *testing.T) {
	addrs := testenv.FaultClusterAddrs(t)
	dir := testenv.DataDir(t)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer admin.Close()
	ctx := context.Background()
	waitClusterOK(t, addrs, 30*time.Second)

	t.Run("script flush", func(t *testing.T) {
		res := []string{testenv.Unique("sf-a"), testenv.Unique("sf-b"), testenv.Unique("sf-c"), "rw:" + testenv.Unique("sf-rw")}
		run, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		var w workload
		go func() {
			<-w.started() // then the workload runs a second before the fault
			time.Sleep(time.Second)
			_ = admin.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.ScriptFlush(ctx).Err() })
		}()
		w.run(run, addrs, res, 4, 4)
		w.check(t, noLoss)
		if w.saw("NOSCRIPT") == 0 {
			t.Error("no NOSCRIPT met: the flush did not hit the workload")
		}
	})

	t.Run("planned failover", func(t *testing.T) {
		key, _ := sharding.LockKey(sharding.DefaultPrefix, "pf-probe")
		master, replica := masterOf(t, ctx, admin, sharding.Slot(key))
		res := resourcesOn(t, ctx, admin, master, testenv.Unique("pf"), 4)
		res[3] = "rw:" + res[3] // a read-write lock too
		run, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		var w workload
		failedOver := make(chan error, 1)
		go func() {
			<-w.started() // then the workload runs a second before the fault
			time.Sleep(time.Second)
			r := node(replica)
			defer r.Close()
			failedOver <- r.Do(ctx, "cluster", "failover").Err()
		}()
		w.run(run, addrs, res, 4, 4)
		if err := <-failedOver; err != nil {
			t.Fatalf("CLUSTER FAILOVER: %v", err)
		}
		if now, _ := masterOf(t, ctx, admin, sharding.Slot(key)); now != replica {
			admin.ReloadState(ctx)
			if now, _ := masterOf(t, ctx, admin, sharding.Slot(key)); now != replica {
				t.Fatalf("failover did not happen: master is %s", now)
			}
		}
		w.check(t, noLoss)
	})

	// Each run twice: with the workload's fencing and fast retries, and
	// with the library's defaults (no fencing, the default strategy).
	for run := range 2 * max(*migrations, 1) {
		defaults := run%2 == 1
		name := fmt.Sprintf("slot migration/%d", run/2+1)
		if defaults {
			name = fmt.Sprintf("slot migration, defaults/%d", run/2+1)
		}
		t.Run(name, func(t *testing.T) {
			tag := testenv.Unique("mig")
			res := []string{"{" + tag + "}:a", "{" + tag + "}:b", "{" + tag + "}:c", "{" + tag + "}:x,{" + tag + "}:y", "rw:{" + tag + "}:d"}
			slot := sharding.Slot(tag)
			source, _ := masterOf(t, ctx, admin, slot)
			target := otherMaster(t, ctx, admin, source)
			src, dst := node(source), node(target)
			defer src.Close()
			defer dst.Close()

			run, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			w := workload{defaults: defaults}
			migrated := make(chan error, 1)
			var deaf []error // exclusive locks whose waiters cannot hear on the target
			go func() {
				<-w.started() // then the workload runs a second before the fault
				time.Sleep(time.Second)
				migrated <- func() error {
					if err := startMigration(ctx, src, dst, slot); err != nil {
						return err
					}
					time.Sleep(time.Second) // both states held under load
					if err := finishMigration(ctx, addrs, src, dst, slot); err != nil {
						return err
					}
					// The load runs 2 s more: the 4 managers' waiters
					// follow the slot to the target.
					for _, r := range res[:3] {
						k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
						if err := awaitSubscribers(ctx, target, k, 4); err != nil {
							deaf = append(deaf, fmt.Errorf("%s: %w", r, err))
						}
					}
					return nil
				}()
			}()
			w.run(run, addrs, res, 4, len(res))
			if err := <-migrated; err != nil {
				repairMigration(t, ctx, addrs, src, dst, slot)
				t.Fatalf("migration: %v", err)
			}
			for _, err := range deaf {
				t.Errorf("after the migration: %v", err)
			}
			admin.ReloadState(ctx)
			if now, _ := masterOf(t, ctx, admin, slot); now != target {
				t.Fatalf("slot %d is on %s, not %s", slot, now, target)
			}
			w.check(t, noLoss)
			// Every lock is taken all through the migration (the slot is
			// held in MIGRATING for 1 s): a batch, fenced or not, whose
			// script meets TRYAGAIN (keys missing from a migrating slot)
			// is taken key by key, and its fences where their counters are.
			for r, gap := range w.longestGap() {
				if gap > 500*time.Millisecond {
					t.Errorf("%s went %v without an acquisition", r, gap)
				}
			}
			if w.saw("ASK")+w.saw("TRYAGAIN") == 0 {
				t.Error("no ASK or TRYAGAIN met: the migration did not hit the workload")
			}
		})
	}

	// Another master paused (SIGSTOP) past the node timeout: the cluster
	// marks it failed and, until it resumes, every master answers
	// CLUSTERDOWN, the workload's one included. Its replicas are told not
	// to take over meanwhile (cluster-replica-no-failover): a takeover can
	// come so soon after the failure report that the cluster is never seen
	// down, and it leaves the resumed node a replica.
	t.Run("cluster down", func(t *testing.T) {
		tag := testenv.Unique("down")
		res := []string{"{" + tag + "}:a", "{" + tag + "}:b", "{" + tag + "}:x,{" + tag + "}:y", "rw:{" + tag + "}:d"}
		mine, _ := masterOf(t, ctx, admin, sharding.Slot(tag))
		other := otherMaster(t, ctx, admin, mine)
		pid, _ := pidOf(t, dir, other)
		for _, rep := range replicasOf(t, ctx, admin, other) {
			rn := node(rep)
			defer rn.Close()
			if err := rn.ConfigSet(ctx, "cluster-replica-no-failover", "yes").Err(); err != nil {
				t.Fatal(err)
			}
			defer rn.ConfigSet(ctx, "cluster-replica-no-failover", "no")
		}
		run, cancel := context.WithTimeout(ctx, 8*time.Second)
		defer cancel()
		var w workload
		resumed := make(chan error, 1)
		go func() {
			<-w.started() // then the workload runs a second before the fault
			time.Sleep(time.Second)
			if err := exec.Command("kill", "-STOP", pid).Run(); err != nil {
				resumed <- err
				return
			}
			// Paused until the workload's master reports the cluster down
			// (node timeout 2 s, then the failure reports), and 1 s more;
			// at most 10 s.
			mn := node(mine)
			defer mn.Close()
			var down error = errors.New("the cluster was never reported down")
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if info, err := mn.ClusterInfo(ctx).Result(); err == nil && strings.Contains(info, "cluster_state:fail") {
					down = nil
					time.Sleep(time.Second)
					break
				}
			}
			if err := exec.Command("kill", "-CONT", pid).Run(); err != nil {
				down = err
			}
			resumed <- down
		}()
		w.run(run, addrs, res, 4, 4)
		if err := <-resumed; err != nil {
			t.Fatalf("SIGSTOP/SIGCONT: %v", err)
		}
		waitClusterOK(t, addrs, 30*time.Second)
		w.check(t, outageLoss)
		if w.saw("CLUSTERDOWN") == 0 {
			t.Error("no CLUSTERDOWN met")
		}
	})

	// A master reloading its data (DEBUG RELOAD of ~600,000 keys, about a
	// second) answers LOADING meanwhile.
	t.Run("master loading", func(t *testing.T) {
		tag := testenv.Unique("load")
		res := []string{"{" + tag + "}:a", "{" + tag + "}:b", "{" + tag + "}:x,{" + tag + "}:y", "rw:{" + tag + "}:d"}
		slot := sharding.Slot(tag)
		master, _ := masterOf(t, ctx, admin, slot)
		n := redis.NewClient(&redis.Options{Addr: master, ReadTimeout: 30 * time.Second})
		defer n.Close()
		const batches, per = 600, 1000
		fill := n.Pipeline()
		for i := range batches {
			args := []any{"mset"}
			for j := range per {
				args = append(args, fmt.Sprintf("{%s}:fill:%d:%d", tag, i, j), "v")
			}
			fill.Do(ctx, args...)
		}
		if _, err := fill.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() {
			del := n.Pipeline()
			for i := range batches {
				args := []any{"unlink"}
				for j := range per {
					args = append(args, fmt.Sprintf("{%s}:fill:%d:%d", tag, i, j))
				}
				del.Do(ctx, args...)
			}
			if _, err := del.Exec(ctx); err != nil {
				t.Error(err)
			}
		}()
		run, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		var w workload
		reloaded, made := make(chan error, 1), make(chan error, 1)
		var took time.Duration
		go func() {
			<-w.started() // then the workload runs a second before the fault
			time.Sleep(time.Second)
			t0 := time.Now()
			err := n.Do(ctx, "debug", "reload").Err()
			took = time.Since(t0)
			reloaded <- err
		}()
		go func() {
			// A manager made while the master loads: New waits it out.
			// Once the master answers LOADING (no signal: poll, bounded).
			probe := redis.NewClient(&redis.Options{Addr: master, MaxRetries: -1})
			defer probe.Close()
			for i := 0; ; i++ {
				if err := probe.Get(ctx, "{"+tag+"}:probe").Err(); err != nil && strings.HasPrefix(err.Error(), "LOADING") {
					break
				}
				if i == 20000 {
					made <- errors.New("the master never answered LOADING")
					return
				}
				time.Sleep(100 * time.Microsecond)
			}
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1})
			defer c.Close()
			nctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			m, err := manager.New(nctx, c)
			if err == nil {
				err = m.Close(nctx)
			}
			made <- err
		}()
		w.run(run, addrs, res, 4, 4)
		if err := <-reloaded; err != nil {
			t.Fatalf("DEBUG RELOAD: %v", err)
		}
		t.Logf("DEBUG RELOAD took %v", took)
		if err := <-made; err != nil {
			t.Errorf("a manager made while the master loads: %v", err)
		}
		w.check(t, outageLoss)
		if w.saw("LOADING") == 0 {
			t.Error("no LOADING met")
		}
	})

	t.Run("master killed", func(t *testing.T) {
		key, _ := sharding.LockKey(sharding.DefaultPrefix, "kill-probe")
		master, _ := masterOf(t, ctx, admin, sharding.Slot(key))
		pid, port := pidOf(t, dir, master)
		onMaster := resourcesOn(t, ctx, admin, master, testenv.Unique("kill"), 4)
		res, load := onMaster[0], onMaster[1:]
		load[len(load)-1] = "rw:" + load[len(load)-1] // a read-write lock too

		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		defer c.Close()
		m, err := manager.New(ctx, c, manager.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(context.Background())
		if l, err := m.TryAcquire(ctx, res); err != nil {
			t.Fatal(err)
		} else {
			_ = l.Release(ctx)
		}
		// Under load: managers of their own lock the master's other
		// resources through the kill, until 4 s after the probe's lock
		// comes back.
		var w workload
		wctx, stopLoad := context.WithCancel(ctx)
		defer stopLoad()
		loaded := make(chan struct{})
		go func() {
			defer close(loaded)
			w.run(wctx, addrs, load, 2, 4)
		}()
		// The kill comes once the load runs (its managers made, locks
		// taken; it has no signal: poll, bounded).
		for i := 0; w.count() < 20; i++ {
			if i == 1000 {
				t.Fatal("no load after 10 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		killed := time.Now()
		defer killNode(t, addrs, pid, port)()
		// When does the cluster itself serve the slot again? A survivor's
		// CLUSTER SHARDS says, polled every 50 ms.
		promoted := make(chan time.Duration, 1)
		go func() {
			var survivor string
			for _, a := range addrs {
				if a != master {
					survivor = a
					break
				}
			}
			n := node(survivor)
			defer n.Close()
			for time.Since(killed) < 30*time.Second {
				if slots, err := slotmap.Read(ctx, n); err == nil {
					if r, ok := slots.Of(sharding.Slot(key)); ok && r.Master != "" && r.Master != master {
						promoted <- time.Since(killed)
						return
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			promoted <- 0
		}()
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		l, err := m.Acquire(actx, res)
		if err != nil {
			t.Fatalf("locking on the killed master's slot did not resume: %v", err)
		}
		resumed := time.Since(killed)
		_ = l.Release(ctx)
		// The load goes on on the new master past the TTL of the locks the
		// killed master held (the load's keys that reached the replica
		// hold out until then).
		time.Sleep(4 * time.Second)
		// The load's waiters hear hand-overs again: each exclusive lock's
		// channel is subscribed on its new master by both managers (the
		// old master's subscriptions went with it, without a word).
		for _, r := range load[:len(load)-1] {
			k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
			slots, err := slotmap.Read(ctx, admin)
			if err != nil {
				t.Fatal(err)
			}
			sr, _ := slots.Of(sharding.Slot(k))
			if err := awaitSubscribers(ctx, sr.Master, k, 2); err != nil {
				t.Errorf("%s: %v", r, err)
			}
		}
		stopLoad()
		<-loaded
		took := <-promoted
		t.Logf("kill -9 of a master under load: the cluster promoted its replica after %v; shardlock locked on its slots again after %v (node timeout 2 s)",
			took, resumed)
		// The cluster's own failover is not shardlock's to bound; from the
		// promotion on, locking resumes within 2 s.
		if took > 0 && resumed > took+2*time.Second {
			t.Errorf("resumed %v after the promotion", resumed-took)
		}
		if resumed > 10*time.Second {
			t.Errorf("resumed after %v", resumed)
		}
		w.check(t, writeLoss) // a kill -9 may lose writes not yet replicated
	})

	// An unplanned failover that loses the latest writes to a fence
	// counter: the replica is frozen while fences are taken, the master is
	// killed, and the replica takes over without them. The next fence must
	// still be above every fence handed out before.
	t.Run("fences across an unplanned failover", func(t *testing.T) {
		res := testenv.Unique("fence-failover")
		key, _ := sharding.LockKey(sharding.DefaultPrefix, res)
		slot := sharding.Slot(key)
		master, replica := masterOf(t, ctx, admin, slot)
		masterPid, masterPort := pidOf(t, dir, master)
		replicaPid, _ := pidOf(t, dir, replica)

		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
		defer c.Close()
		m, err := manager.New(ctx, c, manager.WithFencing(true), manager.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(context.Background())
		var highest uint64
		take := func(n int) {
			for range n {
				l, err := m.TryAcquire(ctx, res)
				if err != nil {
					t.Fatal(err)
				}
				if l.Fence() <= highest {
					t.Fatalf("fence %d after %d", l.Fence(), highest)
				}
				highest = l.Fence()
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		take(5)
		mst := node(master)
		defer mst.Close()
		// The replica that takes over must hold the counter so far. After
		// an earlier fault it may still be in its first sync, and the
		// master may have a second replica that answers a WAIT in its
		// place: read the counter on that replica itself.
		rep := redis.NewClient(&redis.Options{Addr: replica, OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			return cn.ReadOnly(ctx).Err()
		}})
		defer rep.Close()
		awaitReplicaCounter(t, ctx, rep, sharding.FenceKey(key), highest)
		// The replica has the counter so far. Freeze it and cut its link
		// (what the master sent before the cut is in the replica's socket
		// and would still arrive), then take more fences: the master keeps
		// them to itself.
		if err := exec.Command("kill", "-STOP", replicaPid).Run(); err != nil {
			t.Fatal(err)
		}
		cont := sync.OnceFunc(func() { _ = exec.Command("kill", "-CONT", replicaPid).Run() })
		defer cont()
		if err := mst.ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
			t.Fatalf("CLIENT KILL TYPE replica: %v", err)
		}
		take(5)
		defer killNode(t, addrs, masterPid, masterPort)()
		cont()
		if err := rep.Do(ctx, "cluster", "failover", "takeover").Err(); err != nil {
			t.Fatalf("CLUSTER FAILOVER TAKEOVER: %v", err)
		}
		// The new master lacks the writes the frozen replica missed.
		for i := 0; ; i++ {
			role, err := rep.Do(ctx, "role").Slice()
			if err == nil && len(role) > 0 && role[0] == "master" {
				break
			}
			if i == 300 {
				t.Fatalf("%s did not become master: %v %v", replica, role, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		counter, err := rep.Get(ctx, sharding.FenceKey(key)).Uint64()
		if err != nil {
			t.Fatal(err)
		}
		if counter >= highest {
			t.Fatalf("the new master's counter is %d, the last fence %d: the failover lost nothing", counter, highest)
		}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		l, err := m.Acquire(actx, res)
		if err != nil {
			t.Fatalf("locking after the takeover: %v", err)
		}
		defer func() { _ = l.Release(ctx) }()
		t.Logf("fences before the failover up to %d, the new master's counter %d, the next fence %d", highest, counter, l.Fence())
		if l.Fence() <= highest {
			t.Fatalf("fence %d after %d: it went back across the failover", l.Fence(), highest)
		}
	})
}
