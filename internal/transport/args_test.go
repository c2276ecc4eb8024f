package transport

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// keyArg makes the interface value a conversion to any makes: the same
// type, value, equality, formatting and type switches, and it stays valid
// after the collector has run.
func TestKeyArgIsTheString(t *testing.T) {
	keys := make([]string, 3)
	for i := range keys {
		keys[i] = fmt.Sprintf("shardlock:{order-%d}", i)
	}
	args := make([]any, len(keys))
	for i := range keys {
		args[i] = keyArg(&keys[i])
	}
	runtime.GC()
	for i, a := range args {
		if a != any(keys[i]) {
			t.Fatalf("arg %d = %v, want %q", i, a, keys[i])
		}
		s, ok := a.(string)
		if !ok || s != keys[i] {
			t.Fatalf("arg %d: a.(string) = %q, %v", i, s, ok)
		}
		if got := fmt.Sprint(a); got != keys[i] {
			t.Fatalf("arg %d prints %q", i, got)
		}
		if got := fmt.Sprintf("%T", a); got != "string" {
			t.Fatalf("arg %d has type %s", i, got)
		}
	}
}

// A key boxed by keyArg costs no allocation.
func TestKeyArgAllocatesNothing(t *testing.T) {
	keys := []string{"shardlock:{a}", "shardlock:{b}"}
	args := make([]any, len(keys))
	if n := testing.AllocsPerRun(100, func() {
		for i := range keys {
			args[i] = keyArg(&keys[i])
		}
	}); n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

// Keys boxed by keyArg reach the server as the keys: a script sees them
// in KEYS. (Routing on a cluster, which reads the first key, is exercised
// by every real-cluster test: each script call goes through scriptCmd.)
func TestScriptKeysReachTheServer(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	keys := []string{"k1", "key-two", ""}
	s := scripter{c: c, process: c.Process}
	got, err := s.Eval(context.Background(), "return KEYS", keys).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(keys) {
		t.Fatalf("KEYS = %q, want %q", got, keys)
	}
}
