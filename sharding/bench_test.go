package sharding

import "testing"

// BenchmarkLockKeys builds the lock keys of a batch of ten resources that
// share a hash tag (as sharding.Group makes them), the work every batch
// acquire does before its round trip, into a slice with room for them.
func BenchmarkLockKeys(b *testing.B) {
	resources := make([]string, 10)
	for i := range resources {
		r, err := Group("order:4711", string(rune('a'+i)))
		if err != nil {
			b.Fatal(err)
		}
		resources[i] = r
	}
	dst := make([]string, 0, len(resources))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := AppendLockKeys(dst, DefaultPrefix, resources); err != nil {
			b.Fatal(err)
		}
	}
}
