// Package metrics is shardlock's one catalogue of Prometheus metric names,
// help texts, labels and buckets, and the collectors the lock engine
// records into.
//
// Every other part of shardlock (the manager, the exporter, the generated
// dashboards and alert rules) takes metric names from the constants here,
// so a rename cannot drift.
//
// # Cardinality
//
// The only labels are a lock class and a closed set of reasons. A lock class
// is named by the caller (manager.WithClass, manager.WithClassFunc);
// [Options.Classes] fixes the allowed set (any other class is counted as
// "other"), and at most [Options.MaxClasses] distinct classes are ever
// used (later ones are counted as "overflow"). Lock keys, resources and
// tokens are never labels.
//
// # Registration
//
// [New] registers on the prometheus.Registerer it is given, never on the
// global one. Several managers may share one *Metrics.
package metrics
