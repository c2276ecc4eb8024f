// Command shardlock lets an operator see and free shardlock's locks:
//
//	shardlock [flags] list [-prefix P] [-class C] [-o table|json]
//	shardlock [flags] show [-o table|json] RESOURCE
//	shardlock [flags] release -force -reason TEXT RESOURCE
//
// Run it with -help for the flags; each has an environment variable
// (SHARDLOCK_CLI_REDIS_ADDR for -redis.addr, and so on).
package main

import (
	"context"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
