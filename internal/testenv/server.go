package testenv

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process of a test's own, on 127.0.0.1, for
// faults that must not disturb other tests: stopping (SIGSTOP), killing
// and restarting it.
type Server struct {
	Addr string
	tb   testing.TB
	dir  string
	port int
	args []string // extra configuration, as redis-server's --name value arguments
	cmd  *exec.Cmd
}

// StartServer starts a standalone redis-server on a free port of
// 127.0.0.1, stopped at cleanup. Without redis-server on PATH it skips the
// test, or fails it under SHARDLOCK_REQUIRE_REDIS=1.
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	return StartServerWith(tb)
}

// StartServerWith is StartServer with extra configuration: arguments as
// redis-server takes them after its own ("--rename-command", "DELIFEQ", "").
func StartServerWith(tb testing.TB, args ...string) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(tb, "redis-server")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), tb: tb, dir: tb.TempDir(), port: port, args: args}
	s.start()
	tb.Cleanup(s.stopProcess)
	return s
}

func (s *Server) start() {
	s.tb.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log")}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	s.cmd.Stdout, s.cmd.Stderr = os.Stderr, os.Stderr
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("redis-server on %s did not answer: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop freezes the server (SIGSTOP): its sockets stay open and nothing
// answers, as a hung server's.
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Cont resumes a stopped server (SIGCONT).
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

// Kill kills the server (SIGKILL) and waits for it to exit.
func (s *Server) Kill() {
	s.tb.Helper()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts a killed server again on the same port (an empty data set).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	s.start()
}

// RestartWith restarts the server on the same port with other extra
// configuration (see StartServerWith): an upgrade, or a downgrade, in place.
func (s *Server) RestartWith(args ...string) {
	s.tb.Helper()
	s.Kill()
	s.args = args
	s.start()
}

func (s *Server) signal(sig syscall.Signal) {
	s.tb.Helper()
	if s.cmd == nil {
		s.tb.Fatal("the server is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.tb.Fatal(err)
	}
}

func (s *Server) stopProcess() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}
