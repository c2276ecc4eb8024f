package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary builds the exporter once per test run and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "shardlock-exporter-test")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "shardlock-exporter")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v", buildErr)
	}
	return binPath
}

// Flags the exporter cannot work with make the binary exit 1 at once with
// one line that names the flag: before it serves, and without a stack
// trace. -h exits 0.
func TestBinaryRefusesBadFlags(t *testing.T) {
	bin := binary(t)
	badWeb := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(badWeb, []byte("tls_server_config:\n  cert_file: /nonexistent.pem\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string // in stderr
	}{
		{"no Redis address and no -demo", nil, 1, "-redis.addr"},
		{"-demo with a Redis address", []string{"-demo", "-redis.addr", "127.0.0.1:1"}, 1, "-demo"},
		{"empty telemetry path", []string{"-demo", "-web.telemetry-path", ""}, 1, "-web.telemetry-path"},
		{"relative telemetry path", []string{"-demo", "-web.telemetry-path", "metrics"}, 1, "-web.telemetry-path"},
		{"telemetry path /", []string{"-demo", "-web.telemetry-path", "/"}, 1, "-web.telemetry-path"},
		{"telemetry path /healthz", []string{"-demo", "-web.telemetry-path", "/healthz"}, 1, "-web.telemetry-path"},
		{"probe timeout past the longest TTL", []string{"-demo", "-probe.timeout", "12h1s"}, 1, "-probe.timeout"},
		{"probe timeout of days", []string{"-demo", "-probe.timeout", "100h"}, 1, "-probe.timeout"},
		{"negative probe timeout", []string{"-demo", "-probe.timeout", "-1s"}, 1, "-probe.timeout"},
		{"negative scan timeout", []string{"-demo", "-scan.timeout", "-1s"}, 1, "-scan.timeout"},
		{"zero scan interval", []string{"-demo", "-scan.interval", "0s"}, 1, "-scan.interval"},
		{"web config that cannot load", []string{"-demo", "-web.config.file", badWeb}, 1, "-web.config.file"},
		{"help", []string{"-h"}, 0, "-web.telemetry-path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"-web.listen-address", "127.0.0.1:0"}, tt.args...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("still running after 20 s; stdout %q", stdout.String())
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d; stderr %q", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.wantErr) {
				t.Fatalf("stderr %q does not name %s", stderr.String(), tt.wantErr)
			}
			if strings.Contains(stderr.String(), "goroutine ") || strings.Contains(stderr.String(), "panic") {
				t.Fatalf("a stack trace: %s", stderr.String())
			}
			if strings.Contains(stdout.String(), "serving") {
				t.Fatalf("it said it was serving first: %q", stdout.String())
			}
		})
	}
}

// The web server's log lines (exporter-toolkit's) go to the exporter's
// logger, as JSON on stderr, with the exporter's own.
func TestBinaryLogsTheWebServer(t *testing.T) {
	cmd := exec.Command(binary(t), "-demo", "-web.listen-address", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		found := false
		for sc.Scan() {
			if !found && strings.HasPrefix(sc.Text(), "serving ") {
				found = true
				serving <- true
			}
		}
		if !found {
			serving <- false
		}
	}()
	select {
	case ok := <-serving:
		if !ok {
			t.Fatalf("it never said it was serving; stderr %q", stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("not serving within 20 s")
	}
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v; stderr %q", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), `"msg":"Listening on"`) {
		t.Fatalf("exporter-toolkit's lines are not in the log: %q", stderr.String())
	}
}
