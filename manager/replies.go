package manager

import (
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// parseGet reads the GET after a SET NX that answered nil: our token (with
// or without the queued mark) means the SET ran after all.
func parseGet(cmd *redis.StringCmd, token string) (int, error) {
	v, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return attemptContended, nil // gone since: not ours
	case transport.IsWrongType(err):
		return attemptContended, nil // a key of another type: someone else's
	case err != nil:
		return 0, err
	case isOurs(v, token):
		return attemptReplay, nil
	}
	return attemptContended, nil
}

// isOurs reports whether a lock key's value v is token, with or without
// sharding.QueuedMark.
func isOurs(v, token string) bool {
	return v == token || (len(v) == len(token)+1 && v[len(token):] == sharding.QueuedMark && v[:len(token)] == token)
}

func parseSetNXGet(cmd *redis.StringCmd, token string) (int, error) {
	old, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return attemptFresh, nil
	case transport.IsWrongType(err):
		return attemptContended, nil // a key of another type: someone else's, left alone
	case err != nil:
		return 0, err
	case isOurs(old, token):
		return attemptReplay, nil
	}
	return attemptContended, nil
}

func parseFenced(res []any, err error) (int, uint64, error) {
	if err != nil {
		return 0, 0, err
	}
	if len(res) != 2 {
		return 0, 0, fmt.Errorf("shardlock: unexpected acquire reply %v", res)
	}
	st, _ := res[0].(int64)
	f, _ := res[1].(int64)
	return int(st), uint64(f), nil
}

// parseBatchReply reads acquire_batch.lua's reply: the integer of its fast
// path, or a table.
func parseBatchReply(reply any, fencing bool) (status int, fences []uint64, held []int, err error) {
	if st, ok := reply.(int64); ok && st == scripts.AcquireSet && !fencing {
		return attemptFresh, nil, nil, nil
	}
	res, _ := reply.([]any)
	if len(res) == 0 {
		return 0, nil, nil, fmt.Errorf("shardlock: unexpected batch acquire reply %v", reply)
	}
	st, _ := res[0].(int64)
	ints := make([]int64, 0, len(res)-1)
	for _, v := range res[1:] {
		n, _ := v.(int64)
		ints = append(ints, n)
	}
	if st == scripts.AcquireHeld {
		held = make([]int, len(ints))
		for i, n := range ints {
			held[i] = int(n)
		}
		return attemptContended, nil, held, nil
	}
	if fencing {
		fences = make([]uint64, len(ints))
		for i, n := range ints {
			fences[i] = uint64(n)
		}
	}
	return int(st), fences, nil, nil
}

// parseRelease reads release.lua's reply: a status, or {HandedToNext,
// fence}.
func parseRelease(res any, err error) (code int64, fence uint64, _ error) {
	if err != nil {
		return 0, 0, err
	}
	switch v := res.(type) {
	case int64:
		return v, 0, nil
	case []any:
		if len(v) == 2 {
			c, _ := v[0].(int64)
			f, _ := v[1].(int64)
			return c, uint64(f), nil
		}
	}
	return 0, 0, fmt.Errorf("shardlock: unexpected release reply %v", res)
}

// releaseResult turns a release script reply into Release's error.
// ambiguous says an earlier try of the same release may have run: then a
// key found gone before the lock's validity ran out was deleted by us.
//
// r is release.lua's code: 1, 2 and 3 released (deleted or handed over), 0
// gone, -1 held by another token, -2 taken by a forced release. After a
// lost reply, while the lock was valid, a key found gone or held by another
// token was released (or handed over) by the earlier try.
func releaseResult(r int64, err error, ambiguous bool, sentAt, validUntil time.Time) error {
	if err != nil {
		return fmt.Errorf("shardlock: release: %w", err)
	}
	switch {
	case r == scripts.Done || r == scripts.HandedOver || r == scripts.HandedToNext:
		return nil
	case ambiguous && sentAt.Before(validUntil):
		return nil
	case r == scripts.Gone:
		return ErrExpired
	case r == scripts.Forced:
		return ErrForceReleased // the caller reads who and why (forcedError)
	}
	return ErrNotHeld
}
