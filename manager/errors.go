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
	// ErrNotHeld: the key is held by another owner now.
	ErrNotHeld = errors.New("shardlock: lock held by another owner")
	// ErrExpired: the key is gone (it expired, or was deleted behind the holder's back).
	ErrExpired = errors.New("shardlock: lock expired")
	// ErrLockLost: the holder no longer holds the lock: the key is gone or
	// owned by someone else, or its validity ran out with no successful
	// renewal. Lock.Err returns it joined with the reason.
	ErrLockLost = errors.New("shardlock: lock lost")
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

// lostError is the error of a lost lock: it matches ErrLockLost and its cause.
type lostError struct{ cause error }

func lost(cause error) error { return &lostError{cause: cause} }

func (e *lostError) Error() string {
	return "shardlock: lock lost: " + strings.TrimPrefix(e.cause.Error(), "shardlock: ")
}

// Unwrap returns ErrLockLost and the cause.
func (e *lostError) Unwrap() []error { return []error{ErrLockLost, e.cause} }
