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
	// ProcessGroup sends cmds to the master that serves the first key
	// among them, in order, on one connection, with no other command
	// between them (a MULTI ... EXEC transaction), each once: none is sent
	// again or redirected, whatever its reply. It returns the first error
	// among their replies.
	ProcessGroup(ctx context.Context, cmds ...redis.Cmder) error
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

func (o *once) ProcessGroup(ctx context.Context, cmds ...redis.Cmder) error {
	if len(cmds) == 0 {
		return nil
	}
	node, ok := o.c.(*redis.Client)
	if !ok {
		n, err := o.c.(*redis.ClusterClient).MasterForKey(ctx, groupKey(cmds))
		if err != nil {
			cmds[len(cmds)-1].SetErr(err)
			return err
		}
		node = n
	}
	return sendGroup(ctx, node, cmds)
}

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

// cmdKey returns the first key of cmd, one of the lock calls' commands:
// a script's first key, MSETEX's, or the key of a single-key command.
func cmdKey(cmd redis.Cmder) string {
	args := cmd.Args()
	i := 1
	switch cmd.Name() {
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
		i = 3
	case "msetex": // MSETEX numkeys key value ...
		i = 2
	}
	if len(args) <= i {
		return ""
	}
	switch k := args[i].(type) {
	case string:
		return k
	case []byte:
		return string(k)
	}
	return ""
}

// groupKey returns the first key of the commands of a group: where it goes.
func groupKey(cmds []redis.Cmder) string {
	for _, c := range cmds {
		if k := cmdKey(c); k != "" {
			return k
		}
	}
	return ""
}

// groupErr returns the first error among the replies of cmds, in order.
func groupErr(cmds []redis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// sendGroup sends cmds to node in order, in one pipeline, each once, bounded
// by ctx's deadline (the client honours it), and returns the first error
// among their replies. Nothing is sent again: a reply that says a command
// did not run (a redirect, a "not now") is the caller's to act on.
func sendGroup(ctx context.Context, node *redis.Client, cmds []redis.Cmder) error {
	pipe := node.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, noRetry{c})
	}
	if _, err := pipe.Exec(ctx); err != nil && !IsReply(err) {
		for _, c := range cmds {
			unstamp(c)
		}
	}
	return groupErr(cmds)
}
