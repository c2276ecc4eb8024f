package manager

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/internal/transport"
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

// On a cluster MSETEX goes alone only where every master answers it with a
// redirect for a key of a slot another master serves, as it answers every
// other command; elsewhere it goes in a transaction. What a master does
// with such a key, tried with a test key that expires at once, decides (a
// Redis 8 node answers MOVED; a Valkey 9.1.2 node runs it). msetexRoutes'
// probe tells the same without writing, and the Manager's batch sends
// MSETEX alone on the cluster exactly then.
func TestRealMsetexAloneOnAClusterOnlyWhereRouted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc := testenv.Cluster(t)
	probe := testenv.Unique("msetex-routes")
	_, other := testenv.MastersOf(t, ctx, cc, probe)
	s, err := serverCommands(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	routes := false
	if s.msetex {
		// 1 (set, on the wrong master, for a second) or a redirect.
		v, err := other.Do(ctx, "msetex", "1", probe, "x", "nx", "px", "1000").Result()
		t.Logf("MSETEX of a key of another master's slot: %v, %v", v, err)
		routes = transport.IsRedirect(err)
		if !routes && v != int64(1) {
			t.Fatalf("MSETEX of a key of another master's slot answered %v, %v: neither a redirect nor run", v, err)
		}
		got, err := msetexRoutes(ctx, cc, other, "shardlock:")
		if err != nil {
			t.Fatal(err)
		}
		if got != routes {
			t.Errorf("msetexRoutes: %v, but the master answers a key of another slot with %v", got, routes)
		}
	}
	if os.Getenv("SHARDLOCK_SERVER") == "redis8" && !routes {
		t.Error("a Redis 8 master runs MSETEX of a key of another master's slot")
	}
	m, err := New(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close(context.Background()) }()
	if m.msetex.Load() != s.msetex {
		t.Errorf("the Manager's batch takes MSETEX on the cluster: %v, want %v", m.msetex.Load(), s.msetex)
	}
	if want := s.msetex && !routes; m.msetexTx.Load() != want {
		t.Errorf("the Manager's batch sends MSETEX in a transaction: %v, want %v", m.msetexTx.Load(), want)
	}
}
