// Command quickstart shows shardlock at work: contending workers, fencing,
// a lock lost behind its holder's back, and Do.
//
//	go run ./cmd/quickstart                         # embedded Redis (miniredis)
//	go run ./cmd/quickstart -redis 127.0.0.1:6379   # a real server
//	go run ./cmd/quickstart -redis 127.0.0.1:7000,127.0.0.1:7001 -cluster
//
// SHARDLOCK_REDIS and SHARDLOCK_CLUSTER=1 stand in for the flags.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}
