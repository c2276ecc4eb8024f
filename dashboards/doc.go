// Package dashboards builds shardlock's Grafana dashboards in Go with
// grafana-foundation-sdk, from the metric names of package metrics.
//
// The JSON files beside this file are generated: run `go generate ./...`
// after changing a dashboard; a test fails when they differ from the
// generator's output. Import them into Grafana (Dashboards > New > Import).
package dashboards

//go:generate go run ./gen
