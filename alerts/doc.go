// Package alerts holds shardlock's Prometheus alerting rules
// (shardlock.rules.yml), their promtool unit tests (tests.yml) and the
// runbook each alert links to (runbook.md). The Go tests check the rules
// against the metrics catalogue and run promtool.
package alerts
