package benchkit

import (
	"os"
	"testing"
	"time"
)

func TestStatCPU(t *testing.T) {
	// utime 250 and stime 50 ticks, after a command name with a space and
	// a parenthesis.
	line := "4242 (redis-server (x) *:6379) S 1 4242 4242 0 -1 4194560 1497 0 0 0 250 50 0 0 20 0 5 0 1234 0 0\n"
	got, ok := statCPU(line)
	if !ok || got != 3*time.Second {
		t.Fatalf("statCPU = %v, %v; want 3s", got, ok)
	}
	if _, ok := statCPU("4242 (short) S 1 2"); ok {
		t.Fatal("a truncated stat line was read")
	}
	if _, ok := processCPU(os.Getpid()); !ok {
		t.Fatal("this process's /proc stat could not be read")
	}
	if _, ok := selfCPU(); !ok {
		t.Fatal("getrusage failed")
	}
}

func TestIOReads(t *testing.T) {
	io := "rchar: 9134\nwchar: 512\nsyscr: 77\nsyscw: 12\nread_bytes: 0\n"
	if n, ok := ioReads(io); !ok || n != 77 {
		t.Fatalf("ioReads = %d, %v; want 77", n, ok)
	}
	if _, ok := ioReads("rchar: 1\n"); ok {
		t.Fatal("a syscr figure read from text without one")
	}
	before, ok := processReads(os.Getpid())
	if !ok {
		t.Fatal("this process's /proc io could not be read")
	}
	if _, err := os.ReadFile("/proc/self/stat"); err != nil {
		t.Fatal(err)
	}
	if after, _ := processReads(os.Getpid()); after <= before {
		t.Fatalf("syscr %d after a file read, %d before", after, before)
	}
}
