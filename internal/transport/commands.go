package transport

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// Commander is what the lock calls send their commands through: the
// coalescer, or the client itself behind once (coalescing off).
type Commander interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
}

// noRetry wraps a command so that go-redis never sends it twice: neither
// its pipelines (which re-send a whole batch after a connection error or a
// "not now" reply at its head) nor a client's own retries (which re-send a
// command whose reply was lost) re-send a command whose NoRetry is true.
// Redirects (MOVED, ASK) are still followed: the command did not run.
type noRetry struct{ redis.Cmder }

func (noRetry) NoRetry() bool { return true }

// scripter is what the lock calls need of a redis.Scripter: script
// commands go through process (and so through the coalescer, or once),
// script loads straight to the client c.
type scripter struct {
	c       redis.UniversalClient
	process func(context.Context, redis.Cmder) error
}

func (s scripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return scriptCmd(ctx, s.process, argEval, script, keys, args)
}

func (s scripter) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return scriptCmd(ctx, s.process, argEvalSha, sha1, keys, args)
}

func (s scripter) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return scriptCmd(ctx, s.process, argEvalRO, script, keys, args)
}

func (s scripter) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return scriptCmd(ctx, s.process, argEvalShaRO, sha1, keys, args)
}

func (s scripter) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return s.c.ScriptExists(ctx, hashes...)
}

func (s scripter) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return s.c.ScriptLoad(ctx, script)
}

// once sends each command through the client, alone and never twice: the
// lock calls' path when coalescing is off.
type once struct{ scripter }

// newOnce returns a once for c (a pointer: runScript compares commanders).
func newOnce(c redis.UniversalClient) *once {
	return &once{scripter{c: c, process: func(ctx context.Context, cmd redis.Cmder) error {
		return c.Process(ctx, noRetry{cmd})
	}}}
}

func (o *once) Process(ctx context.Context, cmd redis.Cmder) error { return o.process(ctx, cmd) }

// unstamp clears the connection error go-redis stamps on every command of
// a pipeline that failed, from cmd if its reply was read before the
// pipeline failed: a reply leaves a value behind. (A reply that leaves no
// value, an empty string say, keeps the error: it counts as unanswered,
// which is never wrong, only less precise.)
func unstamp(cmd redis.Cmder) {
	if err := cmd.Err(); err == nil || IsReply(err) || errors.Is(err, redis.Nil) {
		return
	}
	var answered bool
	switch c := cmd.(type) {
	case *redis.Cmd:
		answered = c.Val() != nil
	case *redis.StatusCmd:
		answered = c.Val() != ""
	case *redis.StringCmd:
		answered = c.Val() != ""
	case *redis.IntCmd:
		answered = c.Val() != 0
	}
	if answered {
		cmd.SetErr(nil)
	}
}

// The script commands' names, boxed once (see luaTrue).
var (
	argEval      any = "eval"
	argEvalSha   any = "evalsha"
	argEvalRO    any = "eval_ro"
	argEvalShaRO any = "evalsha_ro"
)

// scriptCmd runs a script command (EVAL, EVALSHA and their _RO forms; name
// is one of the arg names above) through process. The command refers to
// the strings of keys in place (keyArg): keys must not change after the
// call (callers pass a lock's keys, fixed when it is made, or a slice made
// for the call). A caller
// that stopped waiting after it was sent gets a command of its own with
// the error, as the coalescer now owns the one it sent.
func scriptCmd(ctx context.Context, process func(context.Context, redis.Cmder) error, name any, body string, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, body, len(keys))
	for i := range keys {
		cmdArgs = append(cmdArgs, keyArg(&keys[i]))
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if err := process(ctx, cmd); IsAbandoned(err) {
		own := redis.NewCmd(ctx)
		own.SetErr(err)
		return own
	}
	return cmd
}
