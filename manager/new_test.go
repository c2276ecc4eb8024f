package manager_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

func TestNewRejectsBadOptions(t *testing.T) {
	_, c := miniClient(t)
	var nilClient *redis.Client
	if _, err := manager.New(context.Background(), nil); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("New(nil) = %v", err)
	}
	if _, err := manager.New(context.Background(), nilClient); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("New(nil *redis.Client) = %v", err)
	}
	tests := []struct {
		name string
		give []manager.Option
	}{
		{"prefix with brace", []manager.Option{manager.WithKeyPrefix("lock{")}},
		{"ttl too short", []manager.Option{manager.WithTTL(time.Millisecond)}},
		{"ttl too long", []manager.Option{manager.WithTTL(25 * time.Hour)}},
		{"renew not below ttl", []manager.Option{manager.WithTTL(time.Second), manager.WithRenewInterval(time.Second)}},
		{"negative renew", []manager.Option{manager.WithRenewInterval(-1)}},
		{"empty owner", []manager.Option{manager.WithOwner("")}},
		{"owner with newline", []manager.Option{manager.WithOwner("a\nb")}},
		{"owner too long", []manager.Option{manager.WithOwner(strings.Repeat("o", manager.MaxOwnerLen+1))}},
		{"nil logger", []manager.Option{manager.WithLogger(nil)}},
		{"nil retry", []manager.Option{manager.WithRetry(nil)}},
		{"negative wait", []manager.Option{manager.WithWait(-time.Second)}},
		{"wait too long", []manager.Option{manager.WithWait(manager.MaxWait + 1)}},
		{"negative max hold", []manager.Option{manager.WithMaxHold(-time.Second)}},
		{"replica timeout zero", []manager.Option{manager.WithReplicaAck(1, 0, manager.ReplicaFail)}},
		{"replica timeout not below ttl", []manager.Option{manager.WithTTL(time.Second), manager.WithReplicaAck(1, time.Second, manager.ReplicaFail)}},
		{"negative replicas", []manager.Option{manager.WithReplicaAck(-1, time.Millisecond, manager.ReplicaFail)}},
		{"unknown replica policy", []manager.Option{manager.WithReplicaAck(1, time.Millisecond, manager.ReplicaPolicy(9))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := manager.New(context.Background(), c, tt.give...)
			var iae *manager.InvalidArgumentError
			if !errors.As(err, &iae) || !errors.Is(err, manager.ErrInvalidArgument) || m != nil {
				t.Fatalf("New = %v, %v; want *InvalidArgumentError", m, err)
			}
		})
	}
}

func TestTraceIDAndFieldsInLogs(t *testing.T) {
	_, c := miniClient(t)
	logger, logs := observedLogger()
	type key struct{}
	m := newManager(t, c, manager.WithLogger(logger), manager.WithOwner("svc-1"),
		manager.WithTraceID(func(ctx context.Context) string { s, _ := ctx.Value(key{}).(string); return s }))
	ctx := context.WithValue(ctxT(t), key{}, "trace-42")
	l, err := m.TryAcquire(ctx, "r", manager.WithFencing(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"lock acquired", "lock released"} {
		es := logs.FilterMessage(msg).All()
		if len(es) != 1 {
			t.Fatalf("%q logged %d times", msg, len(es))
		}
		f := es[0].ContextMap()
		if f["trace_id"] != "trace-42" || f["resource"] != "r" || f["owner"] != "svc-1" || f["fence"] != l.Fence() || l.Fence() == 0 {
			t.Fatalf("%q fields: %v", msg, f)
		}
		if tok, _ := f["token"].(string); tok == l.Token() || !strings.Contains(tok, "…") {
			t.Fatalf("%q logs token %q", msg, tok)
		}
	}
}

func TestStartupCheckSkipsEmulatorVersion(t *testing.T) {
	_, c := miniClient(t)
	// miniredis does not report a server version; New must still work.
	m, err := manager.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// New refuses a server older than Redis 7.0.
func TestNewRejectsOldServer(t *testing.T) {
	_, c := miniClient(t)
	c.AddHook(infoHook{version: "6.2.14"})
	_, err := manager.New(context.Background(), c)
	var sve *manager.ServerVersionError
	if !errors.As(err, &sve) || !errors.Is(err, manager.ErrUnsupportedServer) || sve.Version != "6.2.14" {
		t.Fatalf("New on Redis 6.2 = %v", err)
	}
	_, c2 := miniClient(t)
	c2.AddHook(infoHook{version: "7.0.15"})
	m, err := manager.New(context.Background(), c2)
	if err != nil {
		t.Fatalf("New on Redis 7.0.15 = %v", err)
	}
	_ = m.Close(ctxT(t))
}

// infoHook answers INFO as a server of the given version would.
type infoHook struct{ version string }

func (h infoHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h infoHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if sc, ok := cmd.(*redis.StringCmd); ok && cmd.Name() == "info" {
			sc.SetVal("# Server\r\nredis_version:" + h.version + "\r\nredis_mode:standalone\r\n")
			return nil
		}
		return next(ctx, cmd)
	}
}

func (h infoHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A Setting given to an acquire call overrides the manager's default for
// that call only: fencing can be turned off for one lock.
func TestSettingPerCall(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithFencing(true), manager.WithTTL(5*time.Second))
	ctx := ctxT(t)
	plain, err := m.TryAcquire(ctx, "setting-a", manager.WithFencing(false), manager.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	fenced, err := m.TryAcquire(ctx, "setting-b")
	if err != nil {
		t.Fatal(err)
	}
	if plain.Fence() != 0 || fenced.Fence() == 0 {
		t.Fatalf("fences %d (fencing off for the call) and %d (the default)", plain.Fence(), fenced.Fence())
	}
	if ttl, _ := plain.TTL(ctx); ttl > 2*time.Second {
		t.Fatalf("per-call TTL not applied: %v", ttl)
	}
	if ttl, _ := fenced.TTL(ctx); ttl <= 2*time.Second {
		t.Fatalf("the manager's TTL not applied: %v", ttl)
	}
}

// New's startup check runs by its context: an ended context fails it with
// the context's error and sends nothing; WithStartupCheck(false) skips it;
// a nil context is refused.
func TestNewStartupCheckUsesContext(t *testing.T) {
	_, c := miniClient(t)
	var sent atomic.Int64
	c.AddHook(countAllHook{&sent})
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := manager.New(nil, c); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("New(nil ctx) = %v", err)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := manager.New(ended, c); !errors.Is(err, context.Canceled) {
		t.Fatalf("New with an ended context = %v", err)
	}
	if n := sent.Load(); n != 0 {
		t.Fatalf("New sent %d commands with its context ended", n)
	}
	m, err := manager.New(ended, c, manager.WithStartupCheck(false))
	if err != nil {
		t.Fatalf("New with the check off = %v", err)
	}
	_ = m.Close(ctxT(t))
}

// countAllHook counts the commands a client sends.
type countAllHook struct{ n *atomic.Int64 }

func (h countAllHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countAllHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h countAllHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// The servers the tests run on are the ones the test script says
// (SHARDLOCK_SERVER): Redis 7.0 or later that is not Valkey, Redis 8.4 or
// later, Valkey 9 or later, or Valkey 8 (Valkey reports redis_version
// 7.2.4 whatever its own version), on the standalone server and every
// master of the cluster.
func TestRealServersAreTheExpectedOnes(t *testing.T) {
	want := os.Getenv("SHARDLOCK_SERVER")
	ctx := ctxT(t)
	check := func(name string, c redis.Cmdable) {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			t.Fatal(err)
		}
		field := func(k string) string {
			for line := range strings.Lines(info) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), k+":"); ok {
					return v
				}
			}
			return ""
		}
		major := func(v string) int { n, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0]); return n }
		redisV, valkeyV := field("redis_version"), field("valkey_version")
		t.Logf("%s: redis_version %s, valkey_version %q", name, redisV, valkeyV)
		switch want {
		case "redis":
			if valkeyV != "" || major(redisV) < 7 {
				t.Errorf("%s: want Redis 7.0 or later, got redis_version %s, valkey_version %q", name, redisV, valkeyV)
			}
		case "redis8":
			if minor, _ := strconv.Atoi(strings.Split(redisV+".0", ".")[1]); valkeyV != "" || major(redisV) < 8 || major(redisV) == 8 && minor < 4 {
				t.Errorf("%s: want Redis 8.4 or later, got redis_version %s, valkey_version %q", name, redisV, valkeyV)
			}
		case "valkey":
			if major(valkeyV) < 9 {
				t.Errorf("%s: want Valkey 9.0 or later, got valkey_version %q", name, valkeyV)
			}
		case "valkey8":
			if major(valkeyV) != 8 {
				t.Errorf("%s: want Valkey 8.x, got valkey_version %q", name, valkeyV)
			}
		case "": // run by hand, not by scripts/test.sh: any server
		default:
			t.Errorf("SHARDLOCK_SERVER is %q: want redis, redis8, valkey or valkey8", want)
		}
	}
	check("standalone", testenv.Standalone(t))
	err := testenv.Cluster(t).ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		check(n.Options().Addr, n)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
