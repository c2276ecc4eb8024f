// Package e2e holds the end-to-end test of shardlock's observability: a
// real Prometheus and Alertmanager on 127.0.0.1 scrape the exporter and an
// instrumented workload on the test cluster, evaluate the project's alert
// rules, and page a local webhook.
package e2e
