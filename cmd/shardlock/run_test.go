package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cli runs the tool with args and returns its exit code, stdout and stderr.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// list, show and release -force against the real server, with the exit
// codes scripts rely on and both output formats.
func TestCLI(t *testing.T) {
	addr := testenv.StandaloneAddr(t)
	c := testenv.Standalone(t)
	m, err := manager.New(context.Background(), c, manager.WithOwner("cli-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := context.Background()
	u := testenv.Unique("cli")
	a, err := m.TryAcquire(ctx, u+"-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryAcquire(ctx, u+"-b"); err != nil {
		t.Fatal(err)
	}
	flags := []string{"-redis.addr", addr}

	code, out, errs := cli(t, append(flags, "list", "-prefix", u, "-o", "json")...)
	if code != exitOK {
		t.Fatalf("list: exit %d, %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("list -o json printed %q", out)
	}
	for _, l := range lines {
		var j lockJSON
		if err := json.Unmarshal([]byte(l), &j); err != nil || j.Owner != "cli-test" || !j.Held || j.TTLSeconds <= 0 {
			t.Fatalf("list line %q: %+v, %v", l, j, err)
		}
		if strings.Contains(l, a.Token()) {
			t.Fatal("list printed a token")
		}
	}
	// -class matches the class the library and the exporter name
	// (metrics.ClassOf): the resource's namespace.
	if _, err := m.TryAcquire(ctx, u+":order"); err != nil {
		t.Fatal(err)
	}
	code, out, errs = cli(t, append(flags, "list", "-prefix", u, "-class", u, "-o", "json")...)
	if code != exitOK || strings.Count(out, "\n") != 1 || !strings.Contains(out, u+":order") {
		t.Fatalf("list -class %s: exit %d, %q %s", u, code, out, errs)
	}
	code, out, _ = cli(t, append(flags, "show", u+"-a")...)
	if code != exitOK || !strings.Contains(out, "cli-test") || !strings.Contains(out, "RESOURCE") {
		t.Fatalf("show: exit %d, %q", code, out)
	}
	if code, _, _ = cli(t, append(flags, "show", u+"-none")...); code != exitNotFound {
		t.Fatalf("show of a free resource: exit %d", code)
	}
	if code, _, _ = cli(t, append(flags, "release", "-force", "-reason", "stuck", u+"-a")...); code != exitOK {
		t.Fatalf("release: exit %d", code)
	}
	var fe *manager.ForcedReleaseError
	if err := a.Release(ctx); !errors.As(err, &fe) || fe.By != "shardlock-cli" || fe.Reason != "stuck" {
		t.Fatalf("the evicted holder's Release = %v", err)
	}
	if code, _, _ = cli(t, append(flags, "release", "-force", "-reason", "stuck", u+"-a")...); code != exitNotFound {
		t.Fatalf("release of nothing: exit %d", code)
	}
	foreign := "shardlock:{" + u + "-f}"
	_ = c.Set(ctx, foreign, "foobar", time.Minute).Err()
	defer c.Del(ctx, foreign)
	if code, _, _ = cli(t, append(flags, "release", "-force", "-reason", "x", u+"-f")...); code != exitRefused {
		t.Fatalf("release of a foreign value: exit %d", code)
	}
	if c.Get(ctx, foreign).Val() != "foobar" {
		t.Fatal("the foreign value was changed")
	}
}

// Bad usage exits 2 before anything is sent; -help exits 0 and explains
// each command.
func TestCLIUsage(t *testing.T) {
	t.Setenv(envPrefix+"REDIS_ADDR", "")
	for _, args := range [][]string{
		{},       // no command
		{"list"}, // no address
		{"-redis.addr", "127.0.0.1:1", "frobnicate"},
		{"-redis.addr", "127.0.0.1:1", "release", "r"},           // no -force
		{"-redis.addr", "127.0.0.1:1", "release", "-force", "r"}, // no reason
		{"-redis.addr", "127.0.0.1:1", "show"},                   // no resource
		{"-redis.addr", "127.0.0.1:1", "list", "-o", "yaml"},
		{"-no-such-flag"},
	} {
		if code, _, _ := cli(t, args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
	code, _, errs := cli(t, "-help")
	if code != exitOK || !strings.Contains(errs, "release") || !strings.Contains(errs, "Exit codes") || !strings.Contains(errs, "SHARDLOCK_CLI_REDIS_ADDR") {
		t.Fatalf("-help: exit %d, %q", code, errs)
	}
}

// The environment stands in for a flag.
func TestCLIEnv(t *testing.T) {
	t.Setenv(envPrefix+"REDIS_ADDR", testenv.StandaloneAddr(t))
	if code, _, errs := cli(t, "list", "-prefix", testenv.Unique("none")); code != exitOK {
		t.Fatalf("list with SHARDLOCK_CLI_REDIS_ADDR: exit %d, %s", code, errs)
	}
}

// The tool works against an embedded Redis too, as the exporter's demo
// runs (it prints the address to point the tool at).
func TestCLIOnEmbeddedRedis(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	m, err := manager.New(context.Background(), c, manager.WithOwner("demo-worker"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	if _, err := m.TryAcquire(context.Background(), "demo:lock"); err != nil {
		t.Fatal(err)
	}
	code, out, errs := cli(t, "-redis.addr", mr.Addr(), "list")
	if code != exitOK || !strings.Contains(out, "demo:lock") || !strings.Contains(out, "demo-worker") {
		t.Fatalf("list on an embedded Redis: exit %d, %q %s", code, out, errs)
	}
}
