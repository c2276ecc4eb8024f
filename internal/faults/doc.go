// Package faults runs shardlock against a Redis Cluster while the cluster
// misbehaves: scripts flushed, a planned failover, a master killed. It uses
// the fault cluster of scripts/redis-test-env.sh, which no other test
// touches, and checks mutual exclusion throughout.
package faults
