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
