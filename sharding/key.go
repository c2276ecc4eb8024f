package sharding

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// DefaultPrefix is the key prefix shardlock uses unless told otherwise.
const DefaultPrefix = "shardlock:"

// Reserved suffixes of the helper keys and channels that live beside a lock
// key in its slot. A resource may not end in one of them, so no lock key can
// ever name another lock's helper key.
const (
	FenceSuffix   = ":fence"
	ChannelSuffix = ":released"
	QueueSuffix   = ":waiters"
	ForcedSuffix  = ":forced"
)

// QueuedMark follows the token in a lock key's value while waiters may be
// queued for the lock in Redis: the lock's release then hands it over
// instead of deleting the key. Owner ids are printable, so no token ends
// in it.
const QueuedMark = "\x1e"

// ErrBadResource reports a resource name that cannot be made into a lock key
// whose helper keys share its slot; see [LockKey].
var ErrBadResource = errors.New("sharding: resource cannot be used as a lock name")

// ErrBadPrefix reports a key prefix that contains a brace: a brace in the
// prefix would change which part of the key Redis Cluster hashes.
var ErrBadPrefix = errors.New("sharding: key prefix must not contain '{' or '}'")

// ValidatePrefix returns ErrBadPrefix when prefix contains '{' or '}'.
func ValidatePrefix(prefix string) error {
	if strings.IndexByte(prefix, '{') >= 0 || strings.IndexByte(prefix, '}') >= 0 { // on every lock call: IndexByte, not ContainsAny's set
		return ErrBadPrefix
	}
	return nil
}

// ResourceOf returns the resource whose lock key under prefix is key: the
// inverse of LockKey ("shardlock:{order:123}" is "order:123",
// "shardlock:{order:123}:stock" is "{order:123}:stock"), and false for a
// key that does not start with prefix.
func ResourceOf(prefix, key string) (string, bool) {
	r, ok := strings.CutPrefix(key, prefix)
	if !ok || r == "" {
		return "", false
	}
	if len(r) >= 2 && r[0] == '{' && r[len(r)-1] == '}' && !strings.ContainsAny(r[1:len(r)-1], "{}") {
		return r[1 : len(r)-1], true
	}
	return r, true
}

// LockKey returns the Redis key of the lock on resource under prefix.
//
// A resource with a non-empty hash tag of its own keeps it:
// LockKey("shardlock:", "{order:123}:stock") is "shardlock:{order:123}:stock".
// Any other resource is wrapped in a tag: LockKey("shardlock:", "order:123")
// is "shardlock:{order:123}". Either way the key's tag is a prefix of its
// helper keys' tags, so [FenceKey], [QueueKey] and [ChannelName] share its slot. A
// resource and the same resource in braces ("x" and "{x}") name the same key.
//
// It returns ErrBadResource when resource is empty, ends in a reserved
// suffix, or contains a '}' without carrying a non-empty tag (wrapping such a
// resource would let the '}' end the tag early); and ErrBadPrefix when the
// prefix contains a brace.
func LockKey(prefix, resource string) (string, error) {
	if err := ValidatePrefix(prefix); err != nil {
		return "", err
	}
	wrap, err := wrapped(resource)
	if err != nil {
		return "", err
	}
	if !wrap {
		return prefix + resource, nil
	}
	return prefix + "{" + resource + "}", nil
}

// LockKeys returns the lock keys of resources under prefix, each as
// [LockKey] makes it, in two allocations however many there are: the keys
// are parts of one string. Its error is ErrBadPrefix, or LockKey's for the
// first resource that has one, wrapped with that resource.
func LockKeys(prefix string, resources []string) ([]string, error) {
	return AppendLockKeys(nil, prefix, resources)
}

// AppendLockKeys appends the lock keys of resources under prefix to dst, as
// LockKeys makes them, and returns the extended slice: one allocation for
// the keys' bytes, and none for the slice where dst has room. On error it
// returns dst unchanged.
func AppendLockKeys(dst []string, prefix string, resources []string) ([]string, error) {
	if err := ValidatePrefix(prefix); err != nil {
		return dst, err
	}
	var endsBuf [16]int
	ends := endsBuf[:0] // where each key ends in the joined string
	size := 0
	for _, r := range resources {
		wrap, err := wrapped(r)
		if err != nil {
			return dst, fmt.Errorf("resource %q: %w", r, err)
		}
		size += len(prefix) + len(r)
		if wrap {
			size += len("{}")
		}
		ends = append(ends, size)
	}
	var sb strings.Builder
	sb.Grow(size)
	for i, r := range resources {
		wrap := ends[i]-sb.Len() > len(prefix)+len(r) // the key's length says it
		sb.WriteString(prefix)
		if wrap {
			sb.WriteByte('{')
			sb.WriteString(r)
			sb.WriteByte('}')
		} else {
			sb.WriteString(r)
		}
	}
	all := sb.String()
	dst = slices.Grow(dst, len(resources))
	start := 0
	for _, end := range ends {
		dst = append(dst, all[start:end])
		start = end
	}
	return dst, nil
}

// wrapped checks resource as LockKey does and reports whether its key
// wraps it in a hash tag.
func wrapped(resource string) (bool, error) {
	if resource == "" || hasReservedSuffix(resource) {
		return false, ErrBadResource
	}
	if _, ok := HashTag(resource); ok {
		return false, nil
	}
	if strings.IndexByte(resource, '}') >= 0 {
		return false, ErrBadResource
	}
	return true, nil
}

// hasReservedSuffix reports whether s ends in one of the reserved suffixes.
// It runs for every resource of every lock call, so it looks at the last
// byte first: most resources end in none of the suffixes' last bytes.
func hasReservedSuffix(s string) bool {
	return s != "" && reservedLast[s[len(s)-1]] && (IsHelperKey(s) || strings.HasSuffix(s, ChannelSuffix))
}

// reservedLast marks the last bytes of the reserved suffixes.
var reservedLast = func() (last [256]bool) {
	for _, suffix := range []string{FenceSuffix, ChannelSuffix, QueueSuffix, ForcedSuffix} {
		last[suffix[len(suffix)-1]] = true
	}
	return last
}()

// FenceKey returns the key of the fencing counter of the lock stored at
// lockKey. It shares lockKey's slot.
func FenceKey(lockKey string) string { return lockKey + FenceSuffix }

// ChannelName returns the (sharded) pub/sub channel on which a release of
// the lock stored at lockKey announces that it deleted the key with waiters
// marked on it ("free"). It shares lockKey's slot.
func ChannelName(lockKey string) string { return lockKey + ChannelSuffix }

// HandoverChannel returns the (sharded) pub/sub channel on which a release
// that hands the lock stored at lockKey to a queued waiter of owner (the
// owner id in its token) announces it: to the new holder's owner, and to
// the owners of the two waiters queued next. The waiters of one Manager hear only
// the hand-overs that concern them, however many processes wait. It shares
// lockKey's slot.
func HandoverChannel(lockKey, owner string) string { return lockKey + ChannelSuffix + ":" + owner }

// QueueKey returns the key of the list of waiters queued for the lock stored
// at lockKey (its fair queue: a release hands the lock to the first of them).
// It shares lockKey's slot.
func QueueKey(lockKey string) string { return lockKey + QueueSuffix }

// ForcedKey returns the key of the short-lived record a forced release
// leaves beside the lock key: "<token>=<who>|<why>".
func ForcedKey(lockKey string) string { return lockKey + ForcedSuffix }

// IsHelperKey reports whether key is a helper key ([FenceKey], [QueueKey],
// [ForcedKey]) rather than a lock key, for tools that scan a key space by
// prefix.
func IsHelperKey(key string) bool {
	return strings.HasSuffix(key, FenceSuffix) || strings.HasSuffix(key, QueueSuffix) || strings.HasSuffix(key, ForcedSuffix)
}
