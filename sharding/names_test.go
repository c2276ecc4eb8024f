package sharding

import (
	"errors"
	"testing"
)

func TestGroup(t *testing.T) {
	a, _ := Group("order:123", "stock")
	b, _ := Group("order:123", "payment")
	if a != "{order:123}:stock" || Slot(a) != Slot(b) {
		t.Fatalf("Group: %q %q", a, b)
	}
	for _, bad := range []string{"", "a{b", "a}"} {
		if _, err := Group(bad, "x"); !errors.Is(err, ErrBadResource) {
			t.Errorf("Group(%q) = %v", bad, err)
		}
	}
}

func TestStripeResource(t *testing.T) {
	got, err := StripeResource("order:hot", 8, 3)
	if err != nil || got != "order:hot#3" {
		t.Fatalf("StripeResource = %q, %v", got, err)
	}
	slots := map[int]bool{}
	for i := range 8 {
		r, _ := StripeResource("order:hot", 8, i)
		key, _ := LockKey(DefaultPrefix, r)
		slots[Slot(key)] = true
	}
	if len(slots) != 8 {
		t.Fatalf("8 stripes in %d slots", len(slots))
	}
	tests := []struct {
		res  string
		n, i int
	}{{"", 8, 0}, {"r", 0, 0}, {"r", 8, 8}, {"r", 8, -1}, {"{tag}:r", 8, 1}}
	for _, tt := range tests {
		if _, err := StripeResource(tt.res, tt.n, tt.i); !errors.Is(err, ErrBadResource) {
			t.Errorf("StripeResource(%q, %d, %d) = %v", tt.res, tt.n, tt.i, err)
		}
	}
}

// The stripe of a partition never changes: these values are part of the
// format (another process, or another version, must agree).
func TestStripeIndexIsStable(t *testing.T) {
	// FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the published test vector),
	// 12638187200555641996, which is 6 modulo 10.
	tests := []struct {
		give string
		n    int
		want int
	}{{"", 8, int(uint64(14695981039346656037) % 8)}, {"a", 10, 6}, {"customer-42", 16, 14}}
	for _, tt := range tests {
		if got := StripeIndex(tt.give, tt.n); got != tt.want {
			t.Errorf("StripeIndex(%q, %d) = %d, want %d", tt.give, tt.n, got, tt.want)
		}
	}
	if StripeIndex("x", 0) != 0 {
		t.Error("n = 0")
	}
}
