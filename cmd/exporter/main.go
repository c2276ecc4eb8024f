// Command shardlock-exporter scans a Redis deployment for shardlock's lock
// keys and serves leak gauges, lock-service health and a synthetic probe to
// Prometheus. It needs a Redis address; -demo runs a demo workload on an
// embedded Redis instead.
//
//	go run ./cmd/exporter -demo                            # demo mode
//	go run ./cmd/exporter -redis.addr 127.0.0.1:7000,127.0.0.1:7001
//
// Every flag falls back to an environment variable: -redis.addr is
// SHARDLOCK_EXPORTER_REDIS_ADDR, and so on (dots and dashes as underscores).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, nil)
	switch {
	case errors.Is(err, flag.ErrHelp):
		// -h: the usage was printed; asking for help is not a failure.
	case err != nil:
		fmt.Fprintln(os.Stderr, "shardlock-exporter:", err)
		os.Exit(1)
	}
}
