package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/manager"
)

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	addrs := fs.String("redis", os.Getenv("SHARDLOCK_REDIS"), "Redis address(es), comma-separated; empty: an embedded miniredis")
	cluster := fs.Bool("cluster", os.Getenv("SHARDLOCK_CLUSTER") == "1", "the addresses are Redis Cluster seeds")
	workers := fs.Int("workers", 4, "workers contending for one lock")
	rounds := fs.Int("rounds", 5, "acquisitions per worker")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *workers < 1 || *workers > 1000 || *rounds < 1 || *rounds > 1000 {
		return errors.New("-workers and -rounds must be in [1, 1000]")
	}

	client, where, closeAll, err := connect(*addrs, *cluster)
	if err != nil {
		return err
	}
	defer closeAll()
	fmt.Fprintf(out, "shardlock quickstart on %s\n", where)

	m, err := manager.New(ctx, client, manager.WithOwner("quickstart"), manager.WithTTL(2*time.Second),
		manager.WithRetry(manager.ExponentialBackoff(5*time.Millisecond, 50*time.Millisecond)))
	if err != nil {
		return err
	}
	defer m.Close(context.WithoutCancel(ctx))

	for _, step := range []func(context.Context, *manager.Manager, redis.UniversalClient, io.Writer) error{
		func(ctx context.Context, m *manager.Manager, _ redis.UniversalClient, out io.Writer) error {
			return contend(ctx, m, out, *workers, *rounds)
		},
		lost, do, readWrite,
	} {
		if err := step(ctx, m, client, out); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "done: every lock released")
	return nil
}

func connect(addrs string, cluster bool) (redis.UniversalClient, string, func(), error) {
	if addrs == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, "", nil, err
		}
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		return c, "an embedded miniredis (" + mr.Addr() + "); pass -redis to use a real server", func() { _ = c.Close(); mr.Close() }, nil
	}
	list := strings.Split(addrs, ",")
	if cluster || len(list) > 1 {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: list})
		return c, "Redis Cluster " + addrs, func() { _ = c.Close() }, nil
	}
	c := redis.NewClient(&redis.Options{Addr: list[0]})
	return c, "Redis " + addrs, func() { _ = c.Close() }, nil
}

// contend: workers contend for one resource; fences rise with every holder.
func contend(ctx context.Context, m *manager.Manager, out io.Writer, workers, rounds int) error {
	var (
		mu      sync.Mutex
		fences  []uint64
		wg      sync.WaitGroup
		firstEr error
	)
	for w := range workers {
		wg.Go(func() {
			for range rounds {
				l, err := m.Acquire(ctx, "demo:invoice-run", manager.WithFencing(true))
				if err != nil {
					mu.Lock()
					firstEr = errors.Join(firstEr, fmt.Errorf("worker %d: %w", w, err))
					mu.Unlock()
					return
				}
				mu.Lock()
				fences = append(fences, l.Fence())
				mu.Unlock()
				time.Sleep(time.Millisecond) // the critical section
				_ = l.Release(ctx)
			}
		})
	}
	wg.Wait()
	if firstEr != nil {
		return firstEr
	}
	slices.Sort(fences)
	if len(slices.Compact(slices.Clone(fences))) != len(fences) {
		return fmt.Errorf("a fence was handed out twice: %v", fences)
	}
	fmt.Fprintf(out, "1. %d workers took %q %d times; fences %d..%d, all distinct\n",
		workers, "demo:invoice-run", len(fences), fences[0], fences[len(fences)-1])

	return nil
}

// lost: a lock deleted behind its holder's back is reported lost.
func lost(ctx context.Context, m *manager.Manager, client redis.UniversalClient, out io.Writer) error {
	l, err := m.TryAcquire(ctx, "demo:lost", manager.WithTTL(300*time.Millisecond))
	if err != nil {
		return err
	}
	client.Del(ctx, l.Key())
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		return errors.New("the watchdog did not notice the lost lock")
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Fprintf(out, "2. key deleted behind the holder's back -> Done closed, Err: %v\n", l.Err())

	return nil
}

// do: Do runs a function under a lock and releases it.
func do(ctx context.Context, m *manager.Manager, _ redis.UniversalClient, out io.Writer) error {
	err := m.Do(ctx, "demo:do", func(ctx context.Context) error {
		fmt.Fprintln(out, "3. Do: running under the lock")
		return nil
	})
	if err != nil {
		return err
	}
	return nil
}

// readWrite: readers share a read-write lock; a writer waits for them.
func readWrite(ctx context.Context, m *manager.Manager, _ redis.UniversalClient, out io.Writer) error {
	r1, err := m.AcquireRead(ctx, "demo:catalog")
	if err != nil {
		return err
	}
	r2, err := m.AcquireRead(ctx, "demo:catalog")
	if err != nil {
		return err
	}
	_, werr := m.TryAcquireWrite(ctx, "demo:catalog")
	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
	w, err := m.AcquireWrite(ctx, "demo:catalog")
	if err != nil {
		return err
	}
	_ = w.Release(ctx)
	fmt.Fprintf(out, "4. two readers shared %q; a writer meanwhile: %v; after them it took it alone\n", "demo:catalog", werr)

	return nil
}
