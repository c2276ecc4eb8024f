package benchkit

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// selfCPU returns this process's CPU time so far.
func selfCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on
// every architecture Go supports on Linux).
const clockTick = 10 * time.Millisecond

// processCPU returns process pid's CPU time so far, from /proc/<pid>/stat
// (utime and stime, fields 14 and 15; the command name before them is in
// parentheses and may hold spaces and parentheses).
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return statCPU(string(b))
}

// statCPU reads the CPU time from s, the text of a /proc/<pid>/stat.
func statCPU(s string) (time.Duration, bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:]) // from field 3, the state
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+k) * clockTick, true
}

// processReads returns how many read system calls process pid has made, from
// the syscr line of /proc/<pid>/io (readable for processes of the same
// user).
func processReads(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0, false
	}
	return ioReads(string(b))
}

// ioReads reads the syscr figure from s, the text of a /proc/<pid>/io.
func ioReads(s string) (int64, bool) {
	for line := range strings.Lines(s) {
		if v, ok := strings.CutPrefix(line, "syscr:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
