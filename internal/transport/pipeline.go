package transport

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// ScriptCall is one script invocation in a pipelined batch.
type ScriptCall struct {
	Script *redis.Script
	Keys   []string
	Args   []any
	Cmd    *redis.Cmd // the call's result, set by RunBatch
}

// RunBatch sends calls in one pipeline per node (a cluster client splits a
// pipeline by node and runs the parts concurrently), each command once:
// go-redis's pipelines send a node's whole batch again after a lost
// connection or a "not now" reply at its head, answered commands included,
// so its retries are off for them (noRetry); redirects are still followed.
// After a connection error the calls whose replies were read keep them,
// and only the others carry the error. Calls that meet NOSCRIPT (a
// failover or SCRIPT FLUSH emptied a node's script cache) are sent once
// more with EVAL. Each call's result is in its cmd; its caller settles a
// call that did not run ("not now") or whose outcome is unknown (a lost
// connection): a release or renewal retries it while the lock is valid, a
// MultiLock acquire gives the group's token to the reaper, or tries again
// if it waits.
func RunBatch(ctx context.Context, c redis.UniversalClient, calls []ScriptCall) {
	send := func(idx []int, eval bool) {
		pipe := c.Pipeline()
		queue := scripter{c: c, process: func(ctx context.Context, cmd redis.Cmder) error {
			return pipe.Process(ctx, noRetry{cmd})
		}}
		for _, i := range idx {
			cl := &calls[i]
			if eval {
				cl.Cmd = cl.Script.Eval(ctx, queue, cl.Keys, cl.Args...)
			} else {
				cl.Cmd = queue.EvalSha(ctx, cl.Script.Hash(), cl.Keys, cl.Args...)
			}
		}
		if _, err := pipe.Exec(ctx); err != nil && !IsReply(err) {
			for _, i := range idx {
				unstamp(calls[i].Cmd)
			}
		}
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	send(all, false)
	var again []int
	for i := range calls {
		if HasReplyPrefix(calls[i].Cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		send(again, true)
	}
}
