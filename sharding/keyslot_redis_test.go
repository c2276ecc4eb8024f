package sharding_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/sharding"
)

// TestSlotMatchesClusterKeyslot checks Slot against CLUSTER KEYSLOT of a real
// cluster node for thousands of generated keys, brace edge cases included.
func TestSlotMatchesClusterKeyslot(t *testing.T) {
	addrs := testenv.ClusterAddrs(t)
	node := redis.NewClient(&redis.Options{Addr: addrs[0]})
	t.Cleanup(func() { _ = node.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	keys := []string{"", "{", "}", "{}", "{}{}", "}{", "{{}}", "{a}", "a{", "{user1000}.following",
		"foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "\x00{\xff}", "中文{锁}"}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("ab{}:\x00\xff ")
	for n := range 5000 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		keys = append(keys, string(b), fmt.Sprintf("order:%d", n))
	}

	pipe := node.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.ClusterKeySlot(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	for i, k := range keys {
		if got, want := sharding.Slot(k), int(cmds[i].Val()); got != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}
