package sharding

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// Group returns the resource name of part within group, "{group}:part".
// Every part of a group shares the group's hash tag, so a batch lock on
// them is one script in one slot. It returns ErrBadResource when group is
// empty or contains a brace.
func Group(group, part string) (string, error) {
	if group == "" || strings.ContainsAny(group, "{}") {
		return "", ErrBadResource
	}
	return "{" + group + "}:" + part, nil
}

// StripeResource returns the resource name of stripe i of n of resource:
// "<resource>#<i>". It is a pure function of its arguments, never of the
// topology, so every client locks the same key. Each stripe gets its own
// hash tag once made a lock key, so the stripes spread over slots and
// masters. A resource with a hash tag of its own cannot be striped (its
// stripes would share one slot): ErrBadResource, as for n < 1 or i outside
// [0, n).
func StripeResource(resource string, n, i int) (string, error) {
	if n < 1 || i < 0 || i >= n || resource == "" {
		return "", ErrBadResource
	}
	if _, ok := HashTag(resource); ok {
		return "", ErrBadResource
	}
	return resource + "#" + strconv.Itoa(i), nil
}

// StripeIndex returns the stripe in [0, n) of a partition id: FNV-1a of the
// id modulo n, the same in every process and version. n must be at least 1.
func StripeIndex(partition string, n int) int {
	if n < 1 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(partition))
	return int(h.Sum64() % uint64(n))
}
