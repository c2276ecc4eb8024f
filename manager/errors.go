package manager

import (
	"errors"
	"fmt"
	"sort"
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

// ErrCrossSlot is matched by every *CrossSlotError.
var ErrCrossSlot = errors.New("shardlock: batch resources are in different cluster slots")

// CrossSlotError reports batch resources that do not share a slot, found
// before any round trip. Build co-located names with sharding.Group. It
// matches ErrCrossSlot and ErrInvalidArgument.
type CrossSlotError struct {
	Slots map[string]int // resource -> slot
}

func (e *CrossSlotError) Error() string {
	parts := make([]string, 0, len(e.Slots))
	for r, s := range e.Slots {
		parts = append(parts, fmt.Sprintf("%q:%d", r, s))
	}
	sort.Strings(parts)
	return "shardlock: batch resources are in different cluster slots: " + strings.Join(parts, ", ")
}

// Unwrap returns ErrCrossSlot and ErrInvalidArgument.
func (e *CrossSlotError) Unwrap() []error { return []error{ErrCrossSlot, ErrInvalidArgument} }

// BatchHeldError reports the resources of a batch that other owners held
// when the batch was not acquired. It matches ErrNotAcquired.
type BatchHeldError struct {
	Held []string
}

func (e *BatchHeldError) Error() string {
	return fmt.Sprintf("shardlock: lock not acquired: held by others: %s", strings.Join(e.Held, ", "))
}

// Unwrap returns ErrNotAcquired.
func (e *BatchHeldError) Unwrap() error { return ErrNotAcquired }

// BatchReleaseError reports, per resource, why a batch release did not
// delete every key (ErrNotHeld or ErrExpired; resources released cleanly
// are absent). It matches ErrNotHeld when any key was someone else's, else
// ErrExpired.
type BatchReleaseError struct {
	Results map[string]error
}

func (e *BatchReleaseError) Error() string {
	parts := make([]string, 0, len(e.Results))
	for r, err := range e.Results {
		parts = append(parts, fmt.Sprintf("%s: %v", r, err))
	}
	sort.Strings(parts)
	return "shardlock: batch release: " + strings.Join(parts, "; ")
}

// Unwrap returns ErrNotHeld if any resource was someone else's, else ErrExpired.
func (e *BatchReleaseError) Unwrap() error {
	for _, err := range e.Results {
		if errors.Is(err, ErrNotHeld) {
			return ErrNotHeld
		}
	}
	return ErrExpired
}

// ErrForgotten is what a Lock answers after Forget: its manager no longer
// renews or releases it (another process took it over with Resume). It is
// also the cause of the Lock's Context.
var ErrForgotten = errors.New("shardlock: lock handed on (forgotten)")

// ErrForceReleased: an operator removed the lock with ForceRelease. It is
// in the "no longer held" family (it matches ErrLockLost); a
// *ForcedReleaseError says who forced it and why.
var ErrForceReleased error = &noLongerHeld{"shardlock: lock force-released"}

// ForcedReleaseError is what the evicted holder of a force-released lock
// learns: who forced it (the forcing manager's owner id) and why. It
// matches ErrForceReleased and ErrLockLost.
type ForcedReleaseError struct {
	By, Reason string
}

func (e *ForcedReleaseError) Error() string {
	if e.By == "" && e.Reason == "" {
		return ErrForceReleased.Error()
	}
	return fmt.Sprintf("shardlock: lock force-released by %s: %s", e.By, e.Reason)
}

// Unwrap returns ErrForceReleased.
func (e *ForcedReleaseError) Unwrap() error { return ErrForceReleased }
