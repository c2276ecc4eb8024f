package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// replyErr is an error reply, as go-redis's redis.Error marks one.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

func reply(msg string) error { return replyErr(msg) }

// How the engine classes a command's error: transient (worth retrying),
// ambiguous (the command may have run), ran with an error reply, and the
// not-now and redirect replies that mean it did not run.
func TestErrorClasses(t *testing.T) {
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	tests := []struct {
		name                                        string
		err                                         error
		transient, ambiguous, ran, notNow, redirect bool
	}{
		{"nil", nil, false, false, false, false, false},
		{"redis.Nil", redis.Nil, false, false, false, false, false},
		{"read timeout", timeout, true, true, false, false, false},
		{"EOF", io.EOF, true, true, false, false, false},
		{"unexpected EOF", io.ErrUnexpectedEOF, true, true, false, false, false},
		{"connection reset", fmt.Errorf("write: %w", syscall.ECONNRESET), true, true, false, false, false},
		{"connection refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true, false, false, false, false},
		{"pool timeout", redis.ErrPoolTimeout, true, false, false, false, false},
		{"client closed", redis.ErrClosed, false, false, false, false, false},
		// A bare context error: the command never had a connection (or
		// the coalescer never sent it); one a caller stopped waiting for
		// in flight is abandoned, and may run.
		{"context canceled", context.Canceled, false, false, false, false, false},
		{"deadline exceeded", context.DeadlineExceeded, false, false, false, false, false},
		{"abandoned", &abandonedError{cause: context.DeadlineExceeded}, false, true, false, false, false},
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, true, false, false, false, false},
		{"write timeout", &net.OpError{Op: "write", Net: "tcp", Err: os.ErrDeadlineExceeded}, true, true, false, false, false},
		{"MOVED", reply("MOVED 3999 127.0.0.1:6381"), true, false, false, false, true},
		{"ASK", reply("ASK 3999 127.0.0.1:6381"), true, false, false, false, true},
		{"TRYAGAIN", reply("TRYAGAIN Multiple keys request during rehashing of slot"), true, false, false, true, false},
		{"CLUSTERDOWN", reply("CLUSTERDOWN The cluster is down"), true, false, false, true, false},
		{"LOADING", reply("LOADING Redis is loading the dataset in memory"), true, false, false, true, false},
		{"MASTERDOWN", reply("MASTERDOWN Link with MASTER is down"), true, false, false, true, false},
		{"READONLY", reply("READONLY You can't write against a read only replica."), true, false, false, true, false},
		{"BUSY", reply("BUSY Redis is busy running a script"), true, false, false, false, false},
		{"NOSCRIPT", reply("NOSCRIPT No matching script"), true, false, false, false, false},
		{"WRONGTYPE", reply("WRONGTYPE Operation against a key holding the wrong kind of value"), false, false, true, false, false},
		{"script error", reply("ERR fence counter is not an integer"), false, false, true, false, false},
		{"NOPERM", reply("NOPERM this user has no permissions"), false, false, true, false, false},
		{"wrapped reply", fmt.Errorf("shardlock: %w", reply("TRYAGAIN x")), true, false, false, true, false},
		{"plain error", errors.New("something else"), false, true, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := []bool{IsTransient(tt.err), IsAmbiguous(tt.err), RanWithError(tt.err), IsNotNow(tt.err), IsRedirect(tt.err)}
			want := []bool{tt.transient, tt.ambiguous, tt.ran, tt.notNow, tt.redirect}
			for i, name := range []string{"IsTransient", "IsAmbiguous", "RanWithError", "IsNotNow", "IsRedirect"} {
				if got[i] != want[i] {
					t.Errorf("%s(%v) = %v, want %v", name, tt.err, got[i], want[i])
				}
			}
		})
	}
}
