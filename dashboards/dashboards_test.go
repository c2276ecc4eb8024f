package dashboards_test

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/shardlock/shardlock/dashboards"
	"github.com/shardlock/shardlock/metrics"
)

// The committed JSON is what the generator writes: run go generate ./...
func TestCommittedJSONIsGenerated(t *testing.T) {
	for _, d := range dashboards.All() {
		db, err := d.Build()
		if err != nil {
			t.Fatalf("%s: %v", d.File, err)
		}
		want, err := dashboards.JSON(db)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(d.File)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the generator's output: run go generate ./...", d.File)
		}
	}
}

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
}

type board struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

var (
	metricName = regexp.MustCompile(`\bshardlock_[a-z0-9_]+\b`)
	fixedRange = regexp.MustCompile(`\[[0-9]+[smhdw]\]`)
)

// Every query uses only catalogue metrics, carries the job selector and
// $__rate_interval, and every panel has a query on the datasource variable.
func TestQueriesUseTheCatalogue(t *testing.T) {
	names := metrics.Names(metrics.Library, metrics.Exporter)
	for _, d := range dashboards.All() {
		raw, err := os.ReadFile(d.File)
		if err != nil {
			t.Fatal(err)
		}
		var b board
		if err := json.Unmarshal(raw, &b); err != nil {
			t.Fatal(err)
		}
		vars := map[string]bool{}
		for _, v := range b.Templating.List {
			vars[v.Name] = true
			for _, m := range metricName.FindAllString(string(v.Query), -1) {
				if !names[m] {
					t.Errorf("%s: variable %s uses %s, not in the catalogue", d.File, v.Name, m)
				}
			}
		}
		if !vars["datasource"] || !vars["job"] || !vars["lock_class"] {
			t.Errorf("%s: variables %v lack datasource, job or lock_class", d.File, vars)
		}
		queries := 0
		for _, p := range b.Panels {
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 || p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: panel %q has no query on ${datasource}", d.File, p.Title)
			}
			for _, tg := range p.Targets {
				queries++
				found := metricName.FindAllString(tg.Expr, -1)
				if len(found) == 0 {
					t.Errorf("%s: panel %q: query %q names no shardlock metric", d.File, p.Title, tg.Expr)
				}
				for _, m := range found {
					if !names[m] {
						t.Errorf("%s: panel %q uses %s, not in the catalogue", d.File, p.Title, m)
					}
				}
				if !strings.Contains(tg.Expr, `job=~"$job"`) {
					t.Errorf("%s: panel %q: query %q lacks the job selector", d.File, p.Title, tg.Expr)
				}
				if fixedRange.MatchString(tg.Expr) {
					t.Errorf("%s: panel %q: query %q uses a fixed range, not $__rate_interval", d.File, p.Title, tg.Expr)
				}
			}
		}
		t.Logf("%s: %d panels, %d queries", d.File, len(b.Panels), queries)
	}
}

// The overview covers what the issue lists.
func TestOverviewPanels(t *testing.T) {
	db, err := dashboards.Overview()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := dashboards.JSON(db)
	for _, m := range []string{metrics.AcquireAttemptsTotal, metrics.AcquireFailuresTotal, metrics.AcquireDurationSeconds,
		metrics.HoldDurationSeconds, metrics.LocksHeld, metrics.Waiters, metrics.RenewalsTotal,
		metrics.RenewalFailuresTotal, metrics.LocksLostTotal} {
		if !bytes.Contains(raw, []byte(m)) {
			t.Errorf("overview lacks %s", m)
		}
	}
	if !bytes.Contains(raw, []byte(`"lock_class"`)) {
		t.Error("overview lacks the lock_class variable")
	}
}
