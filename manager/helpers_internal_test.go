package manager

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// newMiniManager returns a Manager with its defaults (no startup check) on
// a client of a fresh miniredis, with hooks added to the client before the
// Manager is made; the test's cleanup closes both.
func newMiniManager(t testing.TB, hooks ...redis.Hook) (*Manager, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	for _, h := range hooks {
		c.AddHook(h)
	}
	m, err := New(context.Background(), c, WithStartupCheck(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m, mr
}
