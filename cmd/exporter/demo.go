package main

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
)

// demoWorkload runs a small workload through the manager on the embedded
// Redis: workers contending for one lock, a slow holder, and one leaked key
// with no TTL. Its metrics go to the exporter's registry.
type demoWorkload struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	m      *manager.Manager
	addr   string // the embedded Redis's
}

func startDemo(ctx context.Context, client redis.UniversalClient, reg prometheus.Registerer, mr *miniredis.Miniredis) (*demoWorkload, error) {
	mx, err := metrics.New(reg, metrics.Options{Classes: []string{"invoice", "report"}})
	if err != nil {
		return nil, err
	}
	m, err := manager.New(ctx, client, manager.WithMetrics(mx), manager.WithOwner("demo"),
		manager.WithTTL(3*time.Second),
		manager.WithClassFunc(metrics.ClassOf),
		manager.WithRetry(manager.ExponentialBackoff(5*time.Millisecond, 100*time.Millisecond)))
	if err != nil {
		return nil, err
	}
	// The leak: a lock key written without a TTL, acquired an hour ago.
	tok := "sl1." + strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10) + ".AAAAAAAAAAAAAAAAAAAAAA.crashed-job"
	if err := mr.Set("shardlock:{report:leaked}", tok); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &demoWorkload{cancel: cancel, m: m, addr: mr.Addr()}
	for range 4 {
		d.wg.Go(func() {
			for ctx.Err() == nil {
				_ = m.Do(ctx, "invoice:run", func(ctx context.Context) error {
					select {
					case <-time.After(20 * time.Millisecond):
					case <-ctx.Done():
					}
					return nil
				}, manager.WithWait(time.Second))
			}
		})
	}
	d.wg.Go(func() { // the slow holder
		for ctx.Err() == nil {
			_ = m.Do(ctx, "report:monthly", func(ctx context.Context) error {
				select {
				case <-time.After(10 * time.Second):
				case <-ctx.Done():
				}
				return nil
			}, manager.WithWait(time.Second))
		}
	})
	return d, nil
}

func (d *demoWorkload) stop() {
	d.cancel()
	d.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = d.m.Close(ctx)
}
