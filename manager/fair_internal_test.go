package manager

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A re-sent acquire finds its own token in the key, with or without the
// queued mark a waiter may have added meanwhile.
func TestParseSetNXGetReplayWithMark(t *testing.T) {
	tok := newToken("o", time.Now())
	for _, tt := range []struct {
		old  string
		nil  bool
		want int
	}{
		{nil: true, want: attemptFresh},
		{old: tok, want: attemptReplay},
		{old: tok + QueuedMark, want: attemptReplay},
		{old: tok + "x", want: attemptContended},
		{old: tok[:len(tok)-1] + QueuedMark, want: attemptContended},
		{old: "other" + QueuedMark, want: attemptContended},
	} {
		cmd := redis.NewStringCmd(context.Background())
		if tt.nil {
			cmd.SetErr(redis.Nil)
		} else {
			cmd.SetVal(tt.old)
		}
		got, err := parseSetNXGet(cmd, tok)
		if err != nil || got != tt.want {
			t.Errorf("old %q: %d, %v; want %d", tt.old, got, err, tt.want)
		}
	}
}

func TestQueueEntry(t *testing.T) {
	ac := &acquireConfig{ttl: 1500 * time.Millisecond, fencing: true}
	w := newFairWaiter("sl1.1.abc.owner:with:colons", ac, time.UnixMilli(1700000000123))
	if got, want := w.makeEntry(), "1700000000123:1500:1:sl1.1.abc.owner:with:colons"; got != want {
		t.Fatalf("entry %q, want %q", got, want)
	}
}
