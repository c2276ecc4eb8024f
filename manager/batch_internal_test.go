package manager

import (
	"errors"
	"slices"
	"testing"

	"github.com/shardlock/shardlock/sharding"
)

// A batch's keys are the resources' lock keys; setKeys makes them and its
// copy of the resources in two allocations however many there are (one
// per key would be ten here), and a bad resource among them is named in a
// typed error.
func TestLockKeysOneString(t *testing.T) {
	m, _ := newMiniManager(t)
	res := []string{"{order:1}:a", "{order:1}:b", "plain", "{order:1}:d", "e", "f", "g", "h", "i", "{x}"}
	copied, keys, err := m.setKeys("batch", res)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(copied, res) || len(keys) != len(res) {
		t.Fatalf("setKeys: %q and %d keys, want %q and %d", copied, len(keys), res, len(res))
	}
	for i, r := range res {
		want, err := m.lockKey(r)
		if err != nil || keys[i] != want {
			t.Errorf("key %d of %q: %q, want %q (%v)", i, r, keys[i], want, err)
		}
	}
	copied[0] = "changed"
	if keys[0] != "shardlock:{order:1}:a" || res[0] != "{order:1}:a" {
		t.Errorf("the copy shares memory with the keys or the caller's slice: %q, %q", keys[0], res[0])
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = m.setKeys("batch", res) }); n != 2 {
		t.Errorf("setKeys of %d resources: %v allocations, want 2", len(res), n)
	}
	_, _, err = m.setKeys("batch", []string{"ok", "bad}", "ok2"})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a bad resource: %v, want ErrInvalidArgument", err)
	}
}

// oneSlot finds a batch's keys in one slot by their tag, and compares
// slots where the tags differ or sit elsewhere in the key: it agrees with
// comparing every key's slot.
func TestOneSlot(t *testing.T) {
	m, _ := newMiniManager(t)
	for _, tt := range []struct {
		res  []string
		want bool
	}{
		{[]string{"{o}:a", "{o}:b", "o"}, true}, // one tag, wrapped or not
		{[]string{"{o}:a", "{p}:b"}, false},     // two tags, two slots
		{[]string{"{o}:a", "{o}"}, true},        // "{o}" is wrapped in its key: shardlock:{o}
		{[]string{"a{o}", "{o}:b"}, true},       // the tag later in the key
		{[]string{"{{o}:a", "{{o}:b", "{o}:c"}, false},
		{[]string{"{user1000}:a", "{user1000}:b", "x{user1000}"}, true},
		{[]string{"{a}:x", "{20200}:y"}, true}, // two tags, one slot
		{[]string{"{a}:x", "{a}:y", "{20200}:y", "{b}:z"}, false},
	} {
		_, keys, err := m.setKeys("batch", tt.res)
		if err != nil {
			t.Fatalf("%q: %v", tt.res, err)
		}
		bySlot := true
		for _, k := range keys {
			bySlot = bySlot && sharding.Slot(k) == sharding.Slot(keys[0])
		}
		if bySlot != tt.want {
			t.Fatalf("case %q: want %v, but its slots say %v", tt.res, tt.want, bySlot)
		}
		if got := oneSlot(m.cfg.prefix, keys); got != tt.want {
			t.Errorf("oneSlot(%q) = %v, want %v", keys, got, tt.want)
		}
	}
}
