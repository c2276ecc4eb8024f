package metrics

import "testing"

func TestClassOf(t *testing.T) {
	tests := []struct{ give, want string }{
		{"order:123", "order"}, {"{order:123}:stock", "order"}, {"{order}:stock", "order"}, {"{a}b", "a"},
		{"plain", ClassDefault}, {":x", ClassDefault}, {"{}x", ClassDefault}, {"", ClassDefault}, {"{x", ClassDefault},
	}
	for _, tt := range tests {
		if got := ClassOf(tt.give); got != tt.want {
			t.Errorf("ClassOf(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
}
