package manager

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/testenv"
)

// serverCommands finds in the command table what each server the tests
// run on has (SHARDLOCK_SERVER, set by scripts/test.sh): Redis 7.0 and
// Valkey 8.0 none of it; Redis 8.4 and later SET ... IFEQ, DELEX ... IFEQ
// and MSETEX, but no DELIFEQ; Valkey 9 SET ... IFEQ, DELIFEQ and MSETEX
// (DELEX from 9.2). The Manager's conditional delete follows: DELEX where
// no DELIFEQ.
func TestRealServerCommandsFound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := testenv.Standalone(t)
	got, err := serverCommands(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %+v", os.Getenv("SHARDLOCK_SERVER"), got)
	check := func(want serverCmds) {
		t.Helper()
		if got != want {
			t.Errorf("on %s: found %+v, want %+v", os.Getenv("SHARDLOCK_SERVER"), got, want)
		}
	}
	switch os.Getenv("SHARDLOCK_SERVER") {
	case "redis", "valkey8":
		check(serverCmds{})
	case "redis8":
		check(serverCmds{setIfeq: true, delex: true, msetex: true})
	case "valkey":
		want := serverCmds{setIfeq: true, delifeq: true, msetex: true}
		want.delex = got.delex // 9.2 adds DELEX; either way DELIFEQ is used
		check(want)
	}
	m, err := New(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close(context.Background()) }()
	if want := !got.delifeq; got.conditional() && m.delex.Load() != want {
		t.Errorf("the Manager's conditional delete is DELEX: %v, want %v", m.delex.Load(), want)
	}
	if m.conditional.Load() != got.conditional() {
		t.Errorf("the Manager's conditional commands on: %v, want %v", m.conditional.Load(), got.conditional())
	}
}
