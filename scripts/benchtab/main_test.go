package main

import (
	"strings"
	"testing"
)

func TestRunMediansAndRatios(t *testing.T) {
	in := `
BenchmarkAcquireRelease/g=1/floor-2      100  10 ns/op  1000 ops/s  16 B/op  1 allocs/op
BenchmarkAcquireRelease/g=1/shardlock-2  100  10 ns/op   900 ops/s  32 B/op  2 allocs/op  7.5 client-cpu-us/op  3.25 server-cpu-us/op  0.04 server-reads/op
BenchmarkAcquireRelease/g=1/floor-2      100  10 ns/op  3000 ops/s  16 B/op  1 allocs/op
BenchmarkAcquireRelease/g=1/shardlock-2  100  10 ns/op  2700 ops/s  32 B/op  2 allocs/op  6.5 client-cpu-us/op  3.5 server-cpu-us/op  0.05 server-reads/op
BenchmarkAcquireRelease/g=1/floor-2      100  10 ns/op  2000 ops/s  16 B/op  1 allocs/op
BenchmarkAcquireRelease/g=1/shardlock-2  100  10 ns/op  1800 ops/s  32 B/op  2 allocs/op  7 client-cpu-us/op  3 server-cpu-us/op  0.03 server-reads/op
BenchmarkBatch/acquire/single-2   100  70000 ns/op
BenchmarkBatch/acquire/batch10-2  100  105000 ns/op
BenchmarkDefaultsPaired/standalone-2  100  2000 ns/op  0.97 shardlock/floor
BenchmarkDefaultsPaired/standalone-2  100  2000 ns/op  0.99 shardlock/floor
BenchmarkDefaultsPaired/standalone-2  100  2000 ns/op  0.95 shardlock/floor
`
	var out strings.Builder
	if err := run(strings.NewReader(in), &out, "shardlock"); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"AcquireRelease/g=1 (median of 3 runs)",
		"| floor | 2000 | 10 | 16 | 1 | - | - | - | 0.90x |",
		"| shardlock | 1800 | 10 | 32 | 2 | 7.00 | 3.25 | 0.040 | - |",
		"shardlock ÷ this (ops/s)",
		"DefaultsPaired (median of 3 runs)",
		"| benchmark | ns/op | shardlock/floor |",
		"| standalone | 2000 | 0.97 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	out.Reset()
	if err := run(strings.NewReader(in), &out, "batch10"); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, "batch10 ÷ this (ns/op)") || !strings.Contains(got, "| single | 0 | 70000 | 0 | 0 | - | - | - | 1.50x |") {
		t.Errorf("latency row:\n%s", got)
	}
}
