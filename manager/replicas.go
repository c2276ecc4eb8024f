package manager

import (
	"context"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// evalWithWait runs script on the master that serves key, followed by a
// WAIT for WithReplicaAck's replicas in the same pipeline, so that WAIT
// counts the replicas that have the script's write. It returns the
// script's reply and the WAIT, which replicaCount reads once the reply
// says the script wrote.
func (m *Manager) evalWithWait(ctx context.Context, key string, script *redis.Script, keys []string, args ...any) (reply, wait *redis.Cmd, err error) {
	node, err := m.tr.MasterFor(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	pipe := node.Pipeline()
	reply = script.Eval(ctx, pipe, keys, args...)
	wait = pipe.Do(ctx, "wait", m.cfg.replicas, m.cfg.replicaTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	return reply, wait, nil
}

// replicaCount reads the WAIT sent after a write that succeeded (an
// acquire or an extend, named by op). The one rule for a WAIT that fails
// (an error reply, a connection lost after the write's reply): it counts
// as no replica acknowledging, it is logged at WARN, and the replica policy
// decides, as for any count below WithReplicaAck's.
func (m *Manager) replicaCount(wait *redis.Cmd, op string) int {
	n, err := wait.Int64()
	if err != nil {
		m.log.Warn("WAIT failed after "+op+"; counted as no replica acknowledging",
			zap.String("event", "replica_ack_failed"), zap.Error(err))
		return 0
	}
	return int(n)
}
