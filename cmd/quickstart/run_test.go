package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardlock/shardlock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, []string{"-workers", "3", "-rounds", "4"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"embedded miniredis", "took \"demo:invoice-run\" 12 times; fences ", ", all distinct", "lock lost", "two readers shared", "a writer meanwhile: shardlock: lock not acquired", "done"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunCluster(t *testing.T) {
	addrs := testenv.ClusterAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, []string{"-redis", strings.Join(addrs, ","), "-cluster"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "Redis Cluster") || !strings.Contains(out.String(), "done") {
		t.Fatalf("output:\n%s", out.String())
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-workers", "0"}, &out); err == nil {
		t.Fatal("run accepted -workers 0")
	}
}
