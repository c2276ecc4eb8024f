package manager

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/transport"
)

// The newer servers' commands the native kinds speak (kind_exclusive_native.go,
// kind_batch_native.go): which a server runs. What the Manager does with
// that, and when a server stops answering them, is in fallback.go.

// serverCmds says which of the newer servers' commands every master runs.
type serverCmds struct {
	setIfeq bool // SET ... IFEQ (Valkey 8.1, Redis 8.4)
	delifeq bool // DELIFEQ (Valkey 9.0)
	delex   bool // DELEX ... IFEQ (Redis 8.4, Valkey 9.2)
	msetex  bool // MSETEX with NX and PX (Valkey 9.1, Redis 8.4)
	// msetexTx: a cluster master runs MSETEX whatever node serves its
	// keys (msetexRoutes), so the batch sends it inside a transaction
	// that a command of the same keys routes (kindBatchNative).
	msetexTx bool
}

// allServerCmds is every command, what and starts from.
var allServerCmds = serverCmds{setIfeq: true, delifeq: true, delex: true, msetex: true}

// conditional reports whether the servers run a conditional write and a
// conditional delete: what kindExclusiveNative and the native hand-over
// need.
func (s serverCmds) conditional() bool { return s.setIfeq && (s.delifeq || s.delex) }

// and is what two sets of masters both run.
func (s serverCmds) and(o serverCmds) serverCmds {
	msetex := s.msetex && o.msetex
	return serverCmds{setIfeq: s.setIfeq && o.setIfeq, delifeq: s.delifeq && o.delifeq,
		delex: s.delex && o.delex, msetex: msetex, msetexTx: msetex && (s.msetexTx || o.msetexTx)}
}

// serverCommands reports which of the commands the server c talks to runs,
// as its command table says (COMMAND INFO, COMMAND DOCS): a renamed or
// disabled command is absent there, whatever the server's version. An
// error reply to COMMAND (an emulator) counts as none.
func serverCommands(ctx context.Context, c *redis.Client) (serverCmds, error) {
	var s serverCmds
	// In COMMAND INFO's order; each command whose arguments matter is
	// confirmed in its docs.
	cmds := []struct {
		has   *bool
		name  string
		words []string
	}{
		{&s.setIfeq, "set", []string{"ifeq"}},
		{&s.delifeq, "delifeq", nil},
		{&s.delex, "delex", []string{"ifeq"}},
		{&s.msetex, "msetex", []string{"nx", "px"}},
	}
	info, err := c.Do(ctx, "command", "info", "set", "delifeq", "delex", "msetex").Slice()
	if transport.IsReply(err) {
		return serverCmds{}, nil
	}
	if err != nil {
		return serverCmds{}, err
	}
	if len(info) != len(cmds) {
		return serverCmds{}, nil
	}
	for i, cmd := range cmds {
		if info[i] == nil {
			continue
		}
		if len(cmd.words) == 0 {
			*cmd.has = true
			continue
		}
		docs, err := c.Do(ctx, "command", "docs", cmd.name).Result()
		if err != nil && !transport.IsReply(err) {
			return serverCmds{}, err
		}
		*cmd.has = err == nil
		for _, w := range cmd.words {
			*cmd.has = *cmd.has && mentions(docs, w)
		}
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

// msetexProbes bounds the keys msetexRoutes tries for one in a slot that
// its master does not serve.
const msetexProbes = 256

// msetexRoutes reports whether master c of cluster cc answers MSETEX for
// a key of a slot that another master serves with a redirect, as it
// answers every other command. (A Valkey 9.1.2 cluster node runs MSETEX
// whichever node serves its keys: during a slot migration a batch taken
// that way could land on the node that no longer serves it.) The probe
// cannot write on any server: it asks for NX and XX together and an
// expiry of 0, which a node that runs it refuses ("syntax error"); its key
// is under prefix, so that an ACL that lets the Manager's keys through
// lets it through too. A master that serves every slot tried (a cluster
// of one master) has no slot to ask about: false.
func msetexRoutes(ctx context.Context, cc *redis.ClusterClient, c *redis.Client, prefix string) (bool, error) {
	addr := c.Options().Addr
	for i := range msetexProbes {
		key := prefix + "{msetex-probe-" + strconv.Itoa(i) + "}"
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return false, err
		}
		if n.Options().Addr == addr {
			continue
		}
		err = c.Do(ctx, "msetex", "1", key, "0", "nx", "xx", "px", "0").Err()
		if err != nil && (!transport.IsReply(err) || transport.IsNotNow(err)) {
			return false, err // the startup check waits out a "not now"
		}
		return transport.IsRedirect(err), nil
	}
	return false, nil
}
