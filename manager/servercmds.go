package manager

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/transport"
)

// The newer servers' commands the native kinds speak (kind_exclusive_native.go,
// kind_batch_native.go): which a server runs. What the Manager does with
// that, and when a server stops answering them, is in fallback.go.

// serverCmds says which of the newer servers' commands every master runs.
type serverCmds struct {
	conditional bool // DELIFEQ, and SET ... IFEQ (Valkey 9.0)
	msetex      bool // MSETEX with NX and PX (Valkey 9.1)
}

// and is what two sets of masters both run.
func (s serverCmds) and(o serverCmds) serverCmds {
	return serverCmds{conditional: s.conditional && o.conditional, msetex: s.msetex && o.msetex}
}

// serverCommands reports which of the commands the server c talks to runs,
// as its command table says (COMMAND INFO, COMMAND DOCS): a renamed or
// disabled command is absent there, whatever the server's version. An
// error reply to COMMAND (an emulator) counts as none.
func serverCommands(ctx context.Context, c *redis.Client) (serverCmds, error) {
	info, err := c.Do(ctx, "command", "info", "delifeq", "msetex").Slice()
	if transport.IsReply(err) {
		return serverCmds{}, nil
	}
	if err != nil {
		return serverCmds{}, err
	}
	var s serverCmds
	if len(info) == 2 {
		s.conditional, s.msetex = info[0] != nil, info[1] != nil
	}
	if s.msetex {
		docs, err := c.Do(ctx, "command", "docs", "msetex").Result()
		if err != nil && !transport.IsReply(err) {
			return serverCmds{}, err
		}
		s.msetex = err == nil && mentions(docs, "nx") && mentions(docs, "px")
	}
	if s.conditional {
		docs, err := c.Do(ctx, "command", "docs", "set").Result()
		if err != nil && !transport.IsReply(err) {
			return serverCmds{}, err
		}
		s.conditional = err == nil && mentions(docs, "ifeq")
	}
	return s, nil
}

// mentions reports whether reply (a COMMAND DOCS reply, RESP2 or RESP3)
// holds the string word anywhere, in any case.
func mentions(reply any, word string) bool {
	switch v := reply.(type) {
	case string:
		return strings.EqualFold(v, word)
	case []any:
		for _, x := range v {
			if mentions(x, word) {
				return true
			}
		}
	case map[any]any:
		for k, x := range v {
			if mentions(k, word) || mentions(x, word) {
				return true
			}
		}
	case map[string]any:
		for k, x := range v {
			if strings.EqualFold(k, word) || mentions(x, word) {
				return true
			}
		}
	}
	return false
}
