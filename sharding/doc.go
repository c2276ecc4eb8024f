// Package sharding is shardlock's key math: Redis Cluster hash slots, hash
// tags and the lock key layout.
//
// Everything here is pure code with no I/O and no Redis client, so the same
// answers hold in every process whatever topology it sees.
//
// # Slots
//
// Redis Cluster maps a key to one of 16384 slots with CRC16-XMODEM of the
// key modulo 16384. When the key contains a hash tag (the bytes between the
// first '{' and the first '}' after it, if there is at least one byte
// between them) only the tag is hashed, so keys that share a tag share a
// slot. [Slot] and [HashTag] follow the cluster specification exactly.
//
// # Lock keys
//
// A lock on resource "order:123" lives under the key "shardlock:{order:123}"
// (see [LockKey]): the resource is wrapped in a hash tag, so every helper key
// of that lock (its fencing counter, its release channel) lands in the same
// slot. A resource that already carries a non-empty tag, such as
// "{order:123}:stock", keeps it, so callers can put several resources in one
// slot on purpose.
package sharding
