package dashboards

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/grafana/grafana-foundation-sdk/go/units"

	"github.com/shardlock/shardlock/metrics"
)

// The dashboards are built with the foundation SDK's dashboard (v1)
// builder, which the SDK marks deprecated in favour of dashboardv2. The v1
// JSON model is the one Grafana imports everywhere (the UI, the HTTP API,
// file provisioning, grafana.com); v2 needs Grafana's newer dashboard
// schema API. The generated files stay v1.
//
//lint:file-ignore SA1019 the v1 dashboard model is the one current Grafana releases import

// Dashboard is one generated dashboard: its file name and its builder.
type Dashboard struct {
	File  string
	Build func() (dashboard.Dashboard, error)
}

// All lists the dashboards, in the order they are written.
func All() []Dashboard {
	return []Dashboard{
		{File: "overview.json", Build: Overview},
		{File: "leaks-and-cluster.json", Build: LeaksAndCluster},
	}
}

// JSON renders d as the indented JSON committed beside this file.
func JSON(d dashboard.Dashboard) ([]byte, error) {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

var ds = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// Selectors every query carries: the library's metrics and the exporter's
// per-class ones by job and lock class, the exporter's others by job.
const (
	libSel = `job=~"$job",lock_class=~"$lock_class"`
	clsSel = libSel
	expSel = `job=~"$job"`
)

func query(expr, legend string) cog.Builder[variants.Dataquery] {
	return prometheus.NewDataqueryBuilder().Expr(expr).LegendFormat(legend).Range()
}

func series(title, desc, unit string, width uint32, targets ...cog.Builder[variants.Dataquery]) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(desc).Datasource(ds).
		Unit(unit).Min(0).Height(8).Span(width)
	for i, t := range targets {
		if q, ok := t.(*prometheus.DataqueryBuilder); ok {
			q.RefId(string(rune('A' + i)))
		}
		p.WithTarget(t)
	}
	return p
}

func single(title, desc, unit string, target cog.Builder[variants.Dataquery]) *stat.PanelBuilder {
	if q, ok := target.(*prometheus.DataqueryBuilder); ok {
		q.RefId("A")
	}
	return stat.NewPanelBuilder().Title(title).Description(desc).Datasource(ds).Unit(unit).
		Height(4).Span(6).WithTarget(target)
}

// variables adds the data source, job and lock class variables; the job
// and class values are read from jobMetric and classMetric.
func variables(b *dashboard.DashboardBuilder, jobMetric, classMetric string) *dashboard.DashboardBuilder {
	b.WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data Source").Type("prometheus"))
	b.WithVariable(dashboard.NewQueryVariableBuilder("job").Label("job").Datasource(ds).
		Query(dashboard.StringOrMap{String: cog.ToPtr(fmt.Sprintf("label_values(%s, job)", jobMetric))}).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc).
		Multi(true).IncludeAll(true).AllValue(".+"))
	b.WithVariable(dashboard.NewQueryVariableBuilder("lock_class").Label("lock class").Datasource(ds).
		Query(dashboard.StringOrMap{String: cog.ToPtr(fmt.Sprintf(`label_values(%s{job=~"$job"}, %s)`,
			classMetric, metrics.LabelClass))}).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc).
		Multi(true).IncludeAll(true).AllValue(".+"))
	return b
}

func rate(metric, sel string) string {
	return fmt.Sprintf(`rate(%s{%s}[$__rate_interval])`, metric, sel)
}

func quantile(q, metric string) string {
	return fmt.Sprintf(`histogram_quantile(%s, sum by (le) (%s))`, q, rate(metric+"_bucket", libSel))
}

// board starts a dashboard with the settings and variables both share.
func board(title, uid, desc, jobMetric, classMetric string) *dashboard.DashboardBuilder {
	b := dashboard.NewDashboardBuilder(title).Uid(uid).Description(desc).
		Tags([]string{"shardlock", "generated"}).
		Refresh("30s").Time("now-1h", "now").Timezone(common.TimeZoneBrowser)
	return variables(b, jobMetric, classMetric)
}

// Overview is the library's view: acquisitions, failures, latency, waits,
// holds, renewals and losses, from the manager's metrics.
func Overview() (dashboard.Dashboard, error) {
	b := board("shardlock / Overview", "shardlock-overview",
		"Locks taken, waited for, held, renewed and lost, from the shardlock library's metrics.",
		metrics.AcquireAttemptsTotal, metrics.AcquireAttemptsTotal)

	b.WithRow(dashboard.NewRowBuilder("Acquire"))
	b.WithPanel(series("Acquire rate by outcome", "Acquisitions that took the lock, and failures by reason.", units.OpsPerSecond, 12,
		query(fmt.Sprintf(`sum(%s) - sum(%s)`, rate(metrics.AcquireAttemptsTotal, libSel), rate(metrics.AcquireFailuresTotal, libSel)), "acquired"),
		query(fmt.Sprintf(`sum by (%s) (%s)`, metrics.LabelReason, rate(metrics.AcquireFailuresTotal, libSel)), "{{reason}}")))
	b.WithPanel(series("Acquire failure ratio (not contention)", "Failures other than contended, timeout, canceled or too_many_waiters, over attempts, by lock class.", units.PercentUnit, 12,
		query(fmt.Sprintf(`sum by (%[1]s) (rate(%[2]s{%[3]s,reason!~"contended|timeout|canceled|too_many_waiters"}[$__rate_interval])) / sum by (%[1]s) (%[4]s)`,
			metrics.LabelClass, metrics.AcquireFailuresTotal, libSel, rate(metrics.AcquireAttemptsTotal, libSel)), "{{lock_class}}")))
	b.WithPanel(series("Acquire latency", "Time in an acquire, waiting included (histogram quantiles).", units.Seconds, 12,
		query(quantile("0.5", metrics.AcquireDurationSeconds), "p50"),
		query(quantile("0.95", metrics.AcquireDurationSeconds), "p95"),
		query(quantile("0.99", metrics.AcquireDurationSeconds), "p99")))
	b.WithPanel(series("Wait", "Mean time in an acquire by lock class, and acquire calls waiting now.", units.Seconds, 12,
		query(fmt.Sprintf(`sum by (%[1]s) (%[2]s) / sum by (%[1]s) (%[3]s)`, metrics.LabelClass,
			rate(metrics.AcquireDurationSeconds+"_sum", libSel), rate(metrics.AcquireDurationSeconds+"_count", libSel)), "mean {{lock_class}}"),
		query(fmt.Sprintf(`sum by (%s) (%s{%s})`, metrics.LabelClass, metrics.Waiters, libSel), "waiters {{lock_class}}")))

	b.WithRow(dashboard.NewRowBuilder("Held locks"))
	b.WithPanel(series("Locks held", "Locks held now, by lock class.", units.Short, 8,
		query(fmt.Sprintf(`sum by (%s) (%s{%s})`, metrics.LabelClass, metrics.LocksHeld, libSel), "{{lock_class}}")))
	b.WithPanel(series("Hold time", "Time from acquisition to release or loss (histogram quantiles).", units.Seconds, 8,
		query(quantile("0.5", metrics.HoldDurationSeconds), "p50"),
		query(quantile("0.99", metrics.HoldDurationSeconds), "p99")))
	b.WithPanel(series("Oldest lock held", "Age of the oldest lock held, by lock class.", units.Seconds, 8,
		query(fmt.Sprintf(`time() - min by (%s) (%s{%s} > 0)`, metrics.LabelClass, metrics.OldestLockAcquiredTimestampSeconds, libSel), "{{lock_class}}")))

	b.WithRow(dashboard.NewRowBuilder("Renewals and losses"))
	b.WithPanel(series("Renewals", "Renewals (watchdog and Extend), and failures by reason.", units.OpsPerSecond, 8,
		query(fmt.Sprintf(`sum(%s)`, rate(metrics.RenewalsTotal, libSel)), "renewals"),
		query(fmt.Sprintf(`sum by (%s) (%s)`, metrics.LabelReason, rate(metrics.RenewalFailuresTotal, libSel)), "failed: {{reason}}")))
	b.WithPanel(series("Releases", "Releases, and releases that found the key gone or someone else's.", units.OpsPerSecond, 8,
		query(fmt.Sprintf(`sum(%s)`, rate(metrics.ReleasesTotal, libSel)), "releases"),
		query(fmt.Sprintf(`sum by (%s) (%s)`, metrics.LabelReason, rate(metrics.ReleaseFailuresTotal, libSel)), "failed: {{reason}}")))
	b.WithPanel(series("Locks lost", "Held locks lost before their release, by reason: mutual exclusion may have been broken.", units.Short, 8,
		query(fmt.Sprintf(`sum by (%s, %s) (increase(%s{%s}[$__rate_interval]))`, metrics.LabelClass, metrics.LabelReason, metrics.LocksLostTotal, libSel), "{{lock_class}} {{reason}}")))
	b.WithPanel(series("Forced releases", "Locks removed by ForceRelease (an operator's action), by lock class.", units.Short, 8,
		query(fmt.Sprintf(`sum by (%s) (increase(%s{%s}[$__rate_interval]))`, metrics.LabelClass, metrics.ForceReleasesTotal, libSel), "{{lock_class}}")))
	return b.Build()
}

// LeaksAndCluster is the exporter's view: lock keys, leaks and overdue
// locks across the cluster, per-master Redis figures, the probe and the
// scan's health.
func LeaksAndCluster() (dashboard.Dashboard, error) {
	b := board("shardlock / Leaks and cluster", "shardlock-leaks-cluster",
		"What the shardlock exporter's scans of every master find: lock keys, leaks, overdue locks, masters, probe.",
		metrics.ScanUp, metrics.LockKeys)

	b.WithRow(dashboard.NewRowBuilder("Lock keys"))
	b.WithPanel(single("Keys without expiry", "Lock keys with no TTL: leaked, they never expire.", units.Short,
		query(fmt.Sprintf(`sum(%s{%s})`, metrics.LockKeysWithoutExpiry, clsSel), "")))
	b.WithPanel(single("Overdue locks", "Locks held longer than the exporter's threshold.", units.Short,
		query(fmt.Sprintf(`sum(%s{%s})`, metrics.LockKeysOverdue, clsSel), "")))
	b.WithPanel(single("Oldest lock", "Age of the oldest lock key in the cluster.", units.Seconds,
		query(fmt.Sprintf(`time() - min(%s{%s} > 0)`, metrics.LockKeyOldestAcquiredSeconds, clsSel), "")))
	b.WithPanel(single("Scan up", "1 when the last scan reached every master.", units.Short,
		query(fmt.Sprintf(`min(%s{%s})`, metrics.ScanUp, expSel), "")))
	b.WithPanel(series("Lock keys by class", "Lock keys, keys without expiry and overdue keys, by lock class.", units.Short, 24,
		query(fmt.Sprintf(`sum by (%s) (%s{%s})`, metrics.LabelClass, metrics.LockKeys, clsSel), "{{lock_class}}"),
		query(fmt.Sprintf(`sum by (%s) (%s{%s})`, metrics.LabelClass, metrics.LockKeysWithoutExpiry, clsSel), "no expiry {{lock_class}}"),
		query(fmt.Sprintf(`sum by (%s) (%s{%s})`, metrics.LabelClass, metrics.LockKeysOverdue, clsSel), "overdue {{lock_class}}")))

	b.WithRow(dashboard.NewRowBuilder("Masters"))
	b.WithPanel(series("Operations per second", "instantaneous_ops_per_sec of each master.", units.OpsPerSecond, 8,
		query(fmt.Sprintf(`sum by (%s) (%s{%s})`, metrics.LabelMaster, metrics.RedisOpsPerSecond, expSel), "{{master}}")))
	b.WithPanel(series("Clients", "Connected and blocked clients of each master.", units.Short, 8,
		query(fmt.Sprintf(`sum by (%s) (%s{%s})`, metrics.LabelMaster, metrics.RedisConnectedClients, expSel), "connected {{master}}"),
		query(fmt.Sprintf(`sum by (%s) (%s{%s})`, metrics.LabelMaster, metrics.RedisBlockedClients, expSel), "blocked {{master}}")))
	b.WithPanel(series("Evicted and expired keys", "Keys evicted (memory pressure: locks can vanish) and expired, per second.", units.OpsPerSecond, 8,
		query(fmt.Sprintf(`sum by (%s) (%s)`, metrics.LabelMaster, rate(metrics.RedisEvictedKeysTotal, expSel)), "evicted {{master}}"),
		query(fmt.Sprintf(`sum by (%s) (%s)`, metrics.LabelMaster, rate(metrics.RedisExpiredKeysTotal, expSel)), "expired {{master}}")))

	b.WithRow(dashboard.NewRowBuilder("Probe and scan"))
	b.WithPanel(series("Probe latency", "Synthetic acquire and release on each master.", units.Seconds, 8,
		query(fmt.Sprintf(`max by (%s) (%s{%s})`, metrics.LabelMaster, metrics.ProbeDurationSeconds, expSel), "{{master}}")))
	b.WithPanel(series("Probe success", "1 when the probe succeeded on the master.", units.Short, 8,
		query(fmt.Sprintf(`min by (%s) (%s{%s})`, metrics.LabelMaster, metrics.ProbeSuccess, expSel), "{{master}}")))
	b.WithPanel(series("Scan", "Duration of the last scan, keys examined, truncation, errors, and keys under the prefix skipped as no lock keys.", units.Short, 8,
		query(fmt.Sprintf(`max(%s{%s})`, metrics.ScanDurationSeconds, expSel), "duration (s)"),
		query(fmt.Sprintf(`max(%s{%s})`, metrics.ScanKeysExamined, expSel), "keys examined"),
		query(fmt.Sprintf(`max(%s{%s})`, metrics.ScanTruncated, expSel), "truncated"),
		query(fmt.Sprintf(`max(%s{%s})`, metrics.ScanErrors, expSel), "errors"),
		query(fmt.Sprintf(`max by (%s) (%s{%s})`, metrics.LabelReason, metrics.ScanSkippedKeys, expSel), "skipped {{reason}}")))
	return b.Build()
}
