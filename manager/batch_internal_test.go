package manager

import (
	"errors"
	"testing"
)

// A batch's keys are the resources' lock keys, made in two allocations
// however many there are (one per key would be ten here), and a bad
// resource among them is named in a typed error.
func TestLockKeysOneString(t *testing.T) {
	m, _ := newMiniManager(t)
	res := []string{"{order:1}:a", "{order:1}:b", "plain", "{order:1}:d", "e", "f", "g", "h", "i", "{x}"}
	keys, err := m.lockKeys(res)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		want, err := m.lockKey(r)
		if err != nil || keys[i] != want {
			t.Errorf("key %d of %q: %q, want %q (%v)", i, r, keys[i], want, err)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = m.lockKeys(res) }); n != 2 {
		t.Errorf("lockKeys of %d resources: %v allocations, want 2", len(res), n)
	}
	_, err = m.lockKeys([]string{"ok", "bad}", "ok2"})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a bad resource: %v, want ErrInvalidArgument", err)
	}
}
