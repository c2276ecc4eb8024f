package alerts

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/shardlock/shardlock/metrics"
)

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var metricName = regexp.MustCompile(`\bshardlock_[a-z0-9_]+\b`)

// Every alert uses only catalogue metrics, has a severity, the three
// annotations, and a runbook section that exists.
func TestRulesAgainstCatalogue(t *testing.T) {
	raw, err := os.ReadFile("shardlock.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(raw, &rf); err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile("runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	names := metrics.Names(metrics.Library, metrics.Exporter)
	alerts := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			alerts++
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				if !names[m] {
					t.Errorf("%s: %s is not in the metrics catalogue", r.Alert, m)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: no %s", r.Alert, a)
				}
			}
			anchor := strings.ToLower(r.Alert)
			if !strings.HasSuffix(r.Annotations["runbook_url"], "/alerts/runbook.md#"+anchor) {
				t.Errorf("%s: runbook_url %q", r.Alert, r.Annotations["runbook_url"])
			}
			if !strings.Contains(string(runbook), "\n## "+r.Alert+"\n") {
				t.Errorf("%s: no section in runbook.md", r.Alert)
			}
		}
	}
	// The list: acquire failures, lost locks, renewals, leaks,
	// overdue locks, probe, scan, exporter.
	if alerts < 8 {
		t.Fatalf("%d alerts", alerts)
	}
}

// promtool checks the rules and runs their unit tests. It comes from
// Debian's prometheus package (scripts/test.sh installs it); without it the
// test fails under SHARDLOCK_REQUIRE_TOOLS=1 and is skipped otherwise.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("SHARDLOCK_REQUIRE_TOOLS") == "1" {
			t.Fatal("promtool not found but SHARDLOCK_REQUIRE_TOOLS=1: apt-get install prometheus")
		}
		t.Skip("promtool not found: apt-get install prometheus")
	}
	for _, args := range [][]string{{"check", "rules", "shardlock.rules.yml"}, {"test", "rules", "tests.yml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
