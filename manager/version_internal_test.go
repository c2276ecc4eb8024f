package manager

import "testing"

func TestVersionLess(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"6.2.14", "7.0.0", true}, {"7.0.15", "7.0.0", false}, {"7.0.0", "7.0.0", false},
		{"10.0.0", "7.0.0", false}, {"7", "7.0.1", true},
	}
	for _, tt := range tests {
		if got := versionLess(tt.a, tt.b); got != tt.want {
			t.Errorf("versionLess(%q, %q) = %v", tt.a, tt.b, got)
		}
	}
}
