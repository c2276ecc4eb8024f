package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// IsReply reports whether err is an error reply from Redis: the server saw
// the command, so nothing about it is ambiguous.
func IsReply(err error) bool {
	_, ok := ReplyMsg(err)
	return ok
}

// ReplyMsg returns the message of the error reply in err's chain (a
// wrapped reply too), and whether there is one; redis.Nil is none.
func ReplyMsg(err error) (string, bool) {
	if err == nil || err == redis.Nil {
		return "", false // the hot path: no errors.As, whose target escapes
	}
	var re redis.Error
	if !errors.As(err, &re) || errors.Is(err, redis.Nil) {
		return "", false
	}
	return re.Error(), true
}

// HasReplyPrefix reports whether err is an error reply starting with prefix.
func HasReplyPrefix(err error, prefix string) bool {
	msg, ok := ReplyMsg(err)
	return ok && strings.HasPrefix(msg, prefix)
}

// IsAmbiguous reports whether a command that failed with err may still have
// run (or may still run later) on the server: a timeout, a dropped
// connection or a cancelled context after the command was written. An
// error that shows the command never left is not (see neverSent).
func IsAmbiguous(err error) bool {
	return err != nil && !IsReply(err) && !errors.Is(err, redis.Nil) && !errors.Is(err, redis.ErrPoolTimeout) &&
		!errors.Is(err, redis.ErrClosed) && !errors.Is(err, syscall.ECONNREFUSED) && !neverSent(err)
}

// neverSent reports whether err says a command was never written: a dial
// that failed, or a context that ended before the command had a
// connection. go-redis answers the bare context error only then (once a
// command is on a connection, an ended deadline is the connection's
// timeout, a *net.OpError), and so do the coalescer and exchange for a
// command they never sent; a caller that stopped waiting for a command in
// flight gets an *abandonedError instead.
func neverSent(err error) bool {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Op == "dial"
	}
	return (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && !IsAbandoned(err)
}

// IsWrongType reports whether err is Redis's WRONGTYPE reply: the key
// holds another type, so it is no lock of ours.
func IsWrongType(err error) bool { return HasReplyPrefix(err, "WRONGTYPE") }

// RanWithError reports whether err is an error reply from a command that
// ran: not a redirect or a "not now" (which mean it did not run). A script
// that failed that way may have written before it failed.
func RanWithError(err error) bool { return IsReply(err) && !IsTransient(err) }

// IsTransient reports whether err is worth retrying: a network fault, or a
// reply that means "not now" (a failover, a migrating slot, a loading node).
// Context errors are not transient: the caller's context decides.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrClosed) {
		return false
	}
	if msg, ok := ReplyMsg(err); ok {
		return IsNotNow(err) || IsRedirect(err) || strings.HasPrefix(msg, "BUSY") || strings.HasPrefix(msg, "NOSCRIPT")
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, redis.ErrPoolTimeout)
}

// AbandonedCause returns err if it is a call its caller stopped waiting
// for, else nil.
func AbandonedCause(err error) error {
	if IsAbandoned(err) {
		return err
	}
	return nil
}

// IsAbandoned reports whether err is a call its caller stopped waiting for.
func IsAbandoned(err error) bool {
	if err == nil {
		return false // the hot path: no errors.As, whose target escapes
	}
	var ae *abandonedError
	return errors.As(err, &ae)
}

// IsRedirect reports whether err is a MOVED or ASK reply.
func IsRedirect(err error) bool {
	msg, ok := ReplyMsg(err)
	if !ok {
		return false
	}
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")
}

// IsNotNow reports whether err is a reply that says "not now": the
// command did not run because the slot is migrating (TRYAGAIN), the
// cluster or the master is down (CLUSTERDOWN, MASTERDOWN), the server is
// loading its data (LOADING) or is a replica now (READONLY).
func IsNotNow(err error) bool {
	msg, ok := ReplyMsg(err)
	if !ok {
		return false
	}
	for _, p := range [...]string{"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// IsTryAgain reports whether err is Redis's TRYAGAIN: a multi-key command
// whose keys are not all on one node while their slot migrates.
func IsTryAgain(err error) bool { return HasReplyPrefix(err, "TRYAGAIN") }

// tryAgainFallback is the context key of WithTryAgainFallback.
type tryAgainFallback struct{}

// WithTryAgainFallback returns ctx marked so that the coalescer hands a
// TRYAGAIN reply to the command's caller rather than sending the command
// again until the slot is stable: the caller has a single-key attempt to
// make instead (attemptUnqueued).
func WithTryAgainFallback(ctx context.Context) context.Context {
	return context.WithValue(ctx, tryAgainFallback{}, true)
}

func fallsBackOnTryAgain(ctx context.Context) bool {
	on, _ := ctx.Value(tryAgainFallback{}).(bool)
	return on
}

// abandonedError is the error of a call whose caller stopped waiting
// before its reply: it matches the context's error. What was sent may
// still run; the Manager settles it when the reply comes.
type abandonedError struct{ cause error }

func (e *abandonedError) Error() string {
	return "shardlock: no reply from Redis in time: " + e.cause.Error()
}

func (e *abandonedError) Unwrap() error { return e.cause }
