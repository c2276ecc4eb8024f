package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"

	"github.com/shardlock/shardlock/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if binPath != "" {
			_ = os.RemoveAll(filepath.Dir(binPath)) // the binary built by flags_test.go
		}
		os.Exit(code)
	}))
}

// start runs the exporter with args and returns its address and a stop
// function that checks run's result.
func start(t *testing.T, args ...string) (string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() { done <- run(ctx, append([]string{"-web.listen-address", "127.0.0.1:0"}, args...), &out, ready) }()
	select {
	case addr := <-ready:
		return addr, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			http.DefaultClient.CloseIdleConnections()
		}
	case err := <-done:
		cancel()
		t.Fatalf("run ended: %v\n%s", err, out.String())
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("exporter did not start")
	}
	return "", nil
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// waitFor polls /metrics until it contains every line of want.
func waitFor(t *testing.T, addr string, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		body := get(t, "http://"+addr+"/metrics")
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q:\n%s", missing, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func promtoolCheck(t *testing.T, body string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("SHARDLOCK_REQUIRE_TOOLS") == "1" {
			t.Fatal("promtool not found")
		}
		t.Skip("promtool not found")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// Demo mode (-demo): an embedded Redis with a workload; the
// leak, the library's metrics and the probe show up.
func TestDemoMode(t *testing.T) {
	addr, stop := start(t, "-demo")
	defer stop()
	body := waitFor(t, addr,
		`shardlock_lock_keys_without_expiry{lock_class="report"} 1`,
		`shardlock_acquire_attempts_total{lock_class="invoice"}`,
		`shardlock_probe_success{master=`,
		`shardlock_scan_up 1`)
	if !strings.Contains(get(t, "http://"+addr+"/"), "/metrics") {
		t.Error("landing page lacks the metrics link")
	}
	if get(t, "http://"+addr+"/healthz") != "ok\n" {
		t.Error("healthz")
	}
	promtoolCheck(t, body)
}

func TestClusterMode(t *testing.T) {
	addrs := testenv.ClusterAddrs(t)
	addr, stop := start(t, "-redis.addr", strings.Join(addrs, ","), "-lock.prefix", testenv.Unique("expcmd")+":")
	defer stop()
	// The first scan and the first probe run at once, side by side: wait
	// for both (a probe's results appear together, every master's).
	body := waitFor(t, addr, "shardlock_scan_up 1", `shardlock_redis_connected_clients{master="127.0.0.1:`,
		"shardlock_probe_success{master=")
	if n := strings.Count(body, "shardlock_probe_success{master="); n != 3 {
		t.Fatalf("%d probe series:\n%s", n, body)
	}
	promtoolCheck(t, body)
}

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("SHARDLOCK_EXPORTER_SCAN_MAX_KEYS", "42")
	t.Setenv("SHARDLOCK_EXPORTER_REDIS_ADDR", "127.0.0.1:1")
	o, err := parseFlags([]string{"-scan.count", "7"})
	if err != nil {
		t.Fatal(err)
	}
	if o.maxKeys != 42 || o.Addr != "127.0.0.1:1" || o.scanCount != 7 {
		t.Fatalf("options %+v", o)
	}
	t.Setenv("SHARDLOCK_EXPORTER_SCAN_COUNT", "many")
	if _, err := parseFlags(nil); err == nil {
		t.Fatal("a bad environment value was accepted")
	}
}

// Basic auth from an exporter-toolkit web config file guards every page.
func TestWebConfigBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(cfg, []byte("basic_auth_users:\n  prom: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, stop := start(t, "-demo", "-web.config.file", cfg)
	defer stop()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without credentials: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.SetBasicAuth("prom", "s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("with credentials: %d", resp.StatusCode)
	}
}

// An ACL user and password, given through the environment.
func TestRedisACLUser(t *testing.T) {
	admin := testenv.Standalone(t)
	ctx := context.Background()
	user := testenv.Unique("exporter")
	if err := admin.Do(ctx, "acl", "setuser", user, "on", ">pw-"+user, "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(ctx, "acl", "deluser", user)
	t.Setenv("SHARDLOCK_EXPORTER_REDIS_PASSWORD", "pw-"+user)
	addr, stop := start(t, "-redis.addr", testenv.StandaloneAddr(t), "-redis.user", user,
		"-lock.prefix", testenv.Unique("acl")+":")
	defer stop()
	waitFor(t, addr, "shardlock_scan_up 1", "shardlock_probe_success{master=")
}
