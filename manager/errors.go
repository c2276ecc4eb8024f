package manager

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrNotAcquired: the lock is held by someone else and the attempt (or
	// the wait) ended without acquiring it. When a wait ends because its
	// context did, the error also matches the context's error.
	ErrNotAcquired = errors.New("shardlock: lock not acquired")
	// ErrLockLost: the holder no longer holds the lock. It is the family
	// of every "no longer held" error: ErrNotHeld and ErrExpired match it,
	// and so does the error of a lock known lost (Lock.Err, and what
	// Release, Extend and TTL return for it), which also matches its
	// reason: ErrNotHeld, ErrExpired (the key is gone, or its validity ran
	// out with no successful renewal) or ErrMaxHoldExceeded.
	ErrLockLost = errors.New("shardlock: lock lost")
	// ErrNotHeld: the key is held by another owner now. It matches
	// ErrLockLost.
	ErrNotHeld error = &noLongerHeld{"shardlock: lock held by another owner"}
	// ErrExpired: the key is gone (it expired, or was deleted behind the
	// holder's back), or, as far as this process knows, its TTL ran out. It
	// matches ErrLockLost.
	ErrExpired error = &noLongerHeld{"shardlock: lock expired"}
	// ErrMaxHoldExceeded: the lock reached its max hold; the watchdog stopped
	// renewing it and cancelled its Context.
	ErrMaxHoldExceeded = errors.New("shardlock: max hold exceeded")
	// ErrReleased is the cause of a Lock's Context after Release.
	ErrReleased = errors.New("shardlock: lock released")
	// ErrClosed: the Manager was closed.
	ErrClosed = errors.New("shardlock: manager closed")
	// ErrNilLock: a method was called on a nil *Lock, or on a zero Lock not
	// made by a Manager.
	ErrNilLock = errors.New("shardlock: nil lock")
	// ErrInvalidArgument is matched by every *InvalidArgumentError.
	ErrInvalidArgument = errors.New("shardlock: invalid argument")
	// ErrReplicaAck is matched by every *ReplicaAckError.
	ErrReplicaAck = errors.New("shardlock: too few replicas acknowledged")
	// ErrUnsupportedServer is matched by every *ServerVersionError.
	ErrUnsupportedServer = errors.New("shardlock: unsupported Redis server")
	// ErrTooManyWaiters: the resource already has the most local waiters
	// allowed (WithMaxLocalWaiters); the acquire failed fast. It matches
	// ErrNotAcquired too.
	ErrTooManyWaiters = fmt.Errorf("shardlock: too many local waiters: %w", ErrNotAcquired)
	// ErrBadToken: a string is not a shardlock token (see ParseToken).
	ErrBadToken = errors.New("shardlock: malformed token")
)

// InvalidArgumentError reports bad input, found before any round trip to
// Redis. It matches ErrInvalidArgument.
type InvalidArgumentError struct {
	Arg    string // the option or argument, e.g. "ttl"
	Reason string
}

func (e *InvalidArgumentError) Error() string {
	return fmt.Sprintf("shardlock: invalid %s: %s", e.Arg, e.Reason)
}

// Unwrap returns ErrInvalidArgument.
func (e *InvalidArgumentError) Unwrap() error { return ErrInvalidArgument }

func invalid(arg, format string, a ...any) error {
	return &InvalidArgumentError{Arg: arg, Reason: fmt.Sprintf(format, a...)}
}

// ReplicaAckError reports that WAIT saw fewer replicas acknowledge a write
// than asked for. It matches ErrReplicaAck.
type ReplicaAckError struct {
	Want, Got int
}

func (e *ReplicaAckError) Error() string {
	return fmt.Sprintf("shardlock: %d of %d replicas acknowledged the lock write", e.Got, e.Want)
}

// Unwrap returns ErrReplicaAck.
func (e *ReplicaAckError) Unwrap() error { return ErrReplicaAck }

// ServerVersionError reports a server older than shardlock needs. It
// matches ErrUnsupportedServer.
type ServerVersionError struct {
	Addr    string
	Version string
	Need    string
}

func (e *ServerVersionError) Error() string {
	return fmt.Sprintf("shardlock: Redis at %s is version %s; shardlock needs %s or later", e.Addr, e.Version, e.Need)
}

// Unwrap returns ErrUnsupportedServer.
func (e *ServerVersionError) Unwrap() error { return ErrUnsupportedServer }

// noLongerHeld is a reason the holder no longer holds a lock: it matches
// ErrLockLost.
type noLongerHeld struct{ msg string }

func (e *noLongerHeld) Error() string { return e.msg }

// Is reports whether target is ErrLockLost.
func (e *noLongerHeld) Is(target error) bool { return target == ErrLockLost }

// validityError is the reason of a lock whose validity ran out with no
// successful renewal (fails of them failed in a row): it matches
// ErrExpired.
type validityError struct{ fails int }

func (e *validityError) Error() string {
	if e.fails > 0 {
		return fmt.Sprintf("validity ran out with no successful renewal (%d failed in a row)", e.fails)
	}
	return "validity ran out with no successful renewal"
}

// Unwrap returns ErrExpired.
func (e *validityError) Unwrap() error { return ErrExpired }

// lostError is the error of a lost lock: it matches ErrLockLost and its cause.
type lostError struct{ cause error }

func lost(cause error) error { return &lostError{cause: cause} }

func (e *lostError) Error() string {
	return "shardlock: lock lost: " + strings.TrimPrefix(e.cause.Error(), "shardlock: ")
}

// Unwrap returns ErrLockLost and the cause.
func (e *lostError) Unwrap() []error { return []error{ErrLockLost, e.cause} }

func (b *batchInfo) heldError(idx []int) error {
	held := make([]string, 0, len(idx))
	for _, i := range idx {
		if i >= 1 && i <= len(b.resources) {
			held = append(held, b.resources[i-1])
		}
	}
	return &BatchHeldError{Held: held}
}
