package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"

	"github.com/shardlock/shardlock/dashboards"
	"github.com/shardlock/shardlock/internal/exporter"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tool finds a binary, failing under SHARDLOCK_REQUIRE_TOOLS=1.
func tool(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("SHARDLOCK_REQUIRE_TOOLS") == "1" {
		t.Fatalf("%v not found but SHARDLOCK_REQUIRE_TOOLS=1: apt-get install prometheus prometheus-alertmanager", names)
	}
	t.Skipf("%v not found", names)
	return ""
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// serve serves reg's metrics on 127.0.0.1 until the test ends.
func serve(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// daemon starts a server process, stopped (and waited for) at cleanup.
func daemon(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, filepath.Base(name)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s log:\n%s", name, tail(string(b), 3000))
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

type webhook struct {
	mu     sync.Mutex
	firing map[string]map[string]string // alertname -> labels
}

func (w *webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	var msg struct {
		Alerts []struct {
			Status string            `json:"status"`
			Labels map[string]string `json:"labels"`
		} `json:"alerts"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		http.Error(rw, err.Error(), 400)
		return
	}
	w.mu.Lock()
	for _, a := range msg.Alerts {
		if a.Status == "firing" {
			w.firing[a.Labels["alertname"]] = a.Labels
		}
	}
	w.mu.Unlock()
}

func (w *webhook) got(name string) map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.firing[name]
}

var forClause = regexp.MustCompile(`(?m)^(\s+for:) .*$`)

func TestAlertsReachWebhookAndDashboardsHaveData(t *testing.T) {
	promBin := tool(t, "prometheus")
	amBin := tool(t, "prometheus-alertmanager", "alertmanager")
	promtool := tool(t, "promtool")
	c := testenv.Cluster(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := testenv.Unique("e2e") + ":"

	// The instrumented workload: locks taken and released in a loop, one
	// lock held throughout, and one lost behind its holder's back.
	reg := prometheus.NewRegistry()
	mx, err := metrics.New(reg, metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.New(ctx, c, manager.WithMetrics(mx), manager.WithKeyPrefix(prefix),
		manager.WithTTL(2*time.Second), manager.WithClassFunc(metrics.ClassOf))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = m.Close(cctx)
	})
	held, err := m.TryAcquire(ctx, "report:held")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			l, err := m.Acquire(ctx, fmt.Sprintf("order:%d", i%4), manager.WithWait(200*time.Millisecond))
			if err == nil {
				time.Sleep(5 * time.Millisecond)
				_ = l.Release(ctx)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	appAddr := serve(t, reg)

	// The exporter, with a leaked key (no TTL) to find.
	e, err := exporter.New(c, exporter.Config{Prefix: prefix, ScanInterval: time.Second, ProbeInterval: time.Second, Overdue: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	leak := prefix + "{leak:1}"
	c.Set(ctx, leak, "sl1."+fmt.Sprint(time.Now().Add(-time.Hour).UnixMilli())+".AAAAAAAAAAAAAAAAAAAAAA.crashed", 0)
	t.Cleanup(func() { c.Del(context.Background(), leak) })
	expReg := prometheus.NewRegistry()
	expReg.MustRegister(e)
	wg.Go(func() { _ = e.Run(ctx) })
	expAddr := serve(t, expReg)

	// Alertmanager pages a local webhook.
	hook := &webhook{firing: map[string]map[string]string{}}
	hookSrv := httptest.NewServer(hook)
	defer hookSrv.Close()
	amAddr := freePort(t)
	amCfg := fmt.Sprintf(`route:
  receiver: pager
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: pager
    webhook_configs:
      - url: %s
`, hookSrv.URL)
	write(t, dir, "alertmanager.yml", amCfg)
	daemon(t, dir, amBin, "--config.file="+filepath.Join(dir, "alertmanager.yml"), "--storage.path="+filepath.Join(dir, "am"),
		"--web.listen-address="+amAddr, "--cluster.listen-address=")

	// Prometheus with the project's rules, their 'for' shortened to 1s.
	rules, err := os.ReadFile("../../alerts/shardlock.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	write(t, dir, "rules.yml", forClause.ReplaceAllString(string(rules), "$1 1s"))
	promAddr := freePort(t)
	write(t, dir, "prometheus.yml", fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [rules.yml]
alerting:
  alertmanagers:
    - static_configs: [{targets: ["%s"]}]
scrape_configs:
  - job_name: app
    static_configs: [{targets: ["%s"]}]
  - job_name: shardlock-exporter
    static_configs: [{targets: ["%s"]}]
`, amAddr, appAddr, expAddr))
	daemon(t, dir, promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr)

	// A lock lost behind its holder's back, once Prometheus scrapes.
	lost, err := m.TryAcquire(ctx, "invoice:lost")
	if err != nil {
		t.Fatal(err)
	}
	waitQuery(t, promAddr, `up{job="app"} == 1`, 30*time.Second)
	c.Del(ctx, lost.Key())
	<-lost.Done()

	// Both pages arrive.
	deadline := time.Now().Add(60 * time.Second)
	for hook.got("ShardlockLeakedLockKeys") == nil || hook.got("ShardlockLocksLost") == nil {
		if time.Now().After(deadline) {
			t.Fatalf("alerts at the webhook: %v", hook.firing)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if l := hook.got("ShardlockLeakedLockKeys"); l["lock_class"] != "leak" || l["severity"] != "critical" {
		t.Errorf("leak alert labels %v", l)
	}
	if l := hook.got("ShardlockLocksLost"); l["lock_class"] != "invoice" || l["reason"] != "expired" {
		t.Errorf("lost-lock alert labels %v", l)
	}

	// Every panel query of every dashboard returns data.
	waitQuery(t, promAddr, `count(rate(shardlock_acquire_attempts_total[1m]))`, 30*time.Second)
	replacer := strings.NewReplacer("$__rate_interval", "1m", `"$job"`, `".+"`, `"$lock_class"`, `".+"`)
	queries := 0
	for _, d := range dashboards.All() {
		raw, err := os.ReadFile(filepath.Join("../../dashboards", d.File))
		if err != nil {
			t.Fatal(err)
		}
		var b struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			t.Fatal(err)
		}
		for _, p := range b.Panels {
			for _, tg := range p.Targets {
				queries++
				expr := replacer.Replace(tg.Expr)
				if n := query(t, promAddr, expr); n == 0 {
					t.Errorf("%s / %s: no data for %s", d.File, p.Title, expr)
				}
			}
		}
	}
	t.Logf("%d dashboard queries returned data", queries)

	// promtool check metrics is clean on both endpoints.
	for _, addr := range []string{appAddr, expAddr} {
		body := httpGet(t, "http://"+addr+"/metrics")
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics on %s: %v\n%s", addr, err, out)
		}
	}
	_ = held.Release(context.Background())
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func httpGet(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// query runs an instant query and returns the number of series it gave.
func query(t *testing.T, promAddr, expr string) int {
	t.Helper()
	resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0
	}
	if r.Status != "success" {
		t.Errorf("query %s: %s", expr, r.Error)
	}
	return len(r.Data.Result)
}

func waitQuery(t *testing.T, promAddr, expr string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for query(t, promAddr, expr) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no data for %s within %v", expr, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
