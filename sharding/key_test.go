package sharding

import "testing"

// ResourceOf undoes LockKey.
func TestResourceOfUndoesLockKey(t *testing.T) {
	for _, r := range []string{"order:123", "{order:123}:stock", "{x}", "a:b:c", "with space"} {
		key, err := LockKey(DefaultPrefix, r)
		if err != nil {
			t.Fatal(err)
		}
		want := r
		if r == "{x}" {
			want = "x" // "x" and "{x}" name one lock
		}
		if got, ok := ResourceOf(DefaultPrefix, key); !ok || got != want {
			t.Errorf("ResourceOf(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
	if _, ok := ResourceOf(DefaultPrefix, "other:{x}"); ok {
		t.Error("a key without the prefix has a resource")
	}
}
