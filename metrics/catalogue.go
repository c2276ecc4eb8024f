package metrics

// Namespace is the prefix of every shardlock metric.
const Namespace = "shardlock"

// Library metrics, recorded by the manager.
const (
	AcquireAttemptsTotal               = "shardlock_acquire_attempts_total"
	AcquireFailuresTotal               = "shardlock_acquire_failures_total"
	AcquireDurationSeconds             = "shardlock_acquire_duration_seconds"
	ReleasesTotal                      = "shardlock_releases_total"
	ReleaseFailuresTotal               = "shardlock_release_failures_total"
	RenewalsTotal                      = "shardlock_renewals_total"
	RenewalFailuresTotal               = "shardlock_renewal_failures_total"
	LocksLostTotal                     = "shardlock_locks_lost_total"
	HoldDurationSeconds                = "shardlock_hold_duration_seconds"
	LocksHeld                          = "shardlock_locks_held"
	OldestLockAcquiredTimestampSeconds = "shardlock_oldest_lock_acquired_timestamp_seconds"
	Waiters                            = "shardlock_waiters"
	ForceReleasesTotal                 = "shardlock_force_releases_total"
)

// Exporter metrics (cmd/exporter): what a scan of every master finds, and
// the health of the scan, the masters and the synthetic probe.
const (
	LockKeys                     = "shardlock_lock_keys"
	LockKeysWithoutExpiry        = "shardlock_lock_keys_without_expiry"
	LockKeysOverdue              = "shardlock_lock_keys_overdue"
	LockKeyOldestAcquiredSeconds = "shardlock_lock_key_oldest_acquired_timestamp_seconds"
	ScanUp                       = "shardlock_scan_up"
	ScanDurationSeconds          = "shardlock_scan_duration_seconds"
	ScanKeysExamined             = "shardlock_scan_keys_examined"
	ScanTruncated                = "shardlock_scan_truncated"
	ScanErrors                   = "shardlock_scan_errors"
	ScanLastSuccessTimestamp     = "shardlock_scan_last_success_timestamp_seconds"
	ScanSkippedKeys              = "shardlock_scan_skipped_keys"
	RedisOpsPerSecond            = "shardlock_redis_instantaneous_ops_per_second"
	RedisConnectedClients        = "shardlock_redis_connected_clients"
	RedisBlockedClients          = "shardlock_redis_blocked_clients"
	RedisEvictedKeysTotal        = "shardlock_redis_evicted_keys_total"
	RedisExpiredKeysTotal        = "shardlock_redis_expired_keys_total"
	ProbeSuccess                 = "shardlock_probe_success"
	ProbeDurationSeconds         = "shardlock_probe_duration_seconds"
)

// Labels.
const (
	LabelClass  = "lock_class"
	LabelReason = "reason"
	LabelMaster = "master" // a master's address: bounded by the cluster's size
)

// Classes with a fixed meaning.
const (
	ClassDefault  = "default"  // an acquire that names no class
	ClassOther    = "other"    // a class outside Options.Classes
	ClassOverflow = "overflow" // a class past Options.MaxClasses
)

// Reasons: the closed set of values of the reason label.
const (
	ReasonContended      = "contended"        // the lock was held (TryAcquire)
	ReasonTimeout        = "timeout"          // the wait limit, the attempts or the context deadline ran out
	ReasonCanceled       = "canceled"         // the caller's context was cancelled
	ReasonInvalid        = "invalid"          // bad input, refused before any round trip
	ReasonClosed         = "closed"           // the manager was closed
	ReasonReplicaAck     = "replica_ack"      // too few replicas acknowledged the write
	ReasonRedisError     = "redis_error"      // Redis failed (network, failover, ...)
	ReasonTooManyWaiters = "too_many_waiters" // the local waiter cap was reached
	ReasonNotHeld        = "not_held"         // another owner holds the key
	ReasonExpired        = "expired"          // the key was gone
	ReasonForced         = "forced"           // an operator removed the lock (ForceRelease)
	ReasonValidity       = "validity"         // the validity ran out with no successful renewal
	ReasonMaxHold        = "max_hold"         // the lock reached its max hold and expired
	ReasonWrongType      = "wrong_type"       // a key under the lock prefix that is not a string
	ReasonUnreadable     = "unreadable"       // a key whose read failed with another error reply
)

// The reasons of each failure counter, pre-created at 0 for every class.
var (
	AcquireFailureReasons = []string{ReasonContended, ReasonTimeout, ReasonCanceled, ReasonInvalid,
		ReasonClosed, ReasonReplicaAck, ReasonRedisError, ReasonTooManyWaiters}
	ReleaseFailureReasons = []string{ReasonNotHeld, ReasonExpired, ReasonForced, ReasonRedisError}
	RenewalFailureReasons = []string{ReasonNotHeld, ReasonExpired, ReasonForced, ReasonRedisError}
	LostReasons           = []string{ReasonNotHeld, ReasonExpired, ReasonForced, ReasonValidity, ReasonMaxHold}
	ScanSkipReasons       = []string{ReasonWrongType, ReasonUnreadable}
)

// Buckets. Acquire resolves sub-millisecond round trips and multi-second
// waits; hold spans a millisecond to an hour.
var (
	AcquireBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	HoldBuckets    = []float64{.001, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600}
)

// Type is a metric's Prometheus type.
type Type string

// The types used.
const (
	Counter   Type = "counter"
	Gauge     Type = "gauge"
	Histogram Type = "histogram"
)

// Desc describes one metric of the catalogue.
type Desc struct {
	Name   string
	Help   string
	Type   Type
	Labels []string
}

// Library lists the metrics the manager records.
var Library = []Desc{
	{AcquireAttemptsTotal, "Acquire calls that finished, whether or not they took the lock.", Counter, []string{LabelClass}},
	{AcquireFailuresTotal, "Acquire calls that did not take the lock, by reason.", Counter, []string{LabelClass, LabelReason}},
	{AcquireDurationSeconds, "Time spent in an acquire, waiting included, whether or not it took the lock.", Histogram, []string{LabelClass}},
	{ReleasesTotal, "Release calls that reached Redis (or were answered from a known loss).", Counter, []string{LabelClass}},
	{ReleaseFailuresTotal, "Releases that did not delete the key, by reason.", Counter, []string{LabelClass, LabelReason}},
	{RenewalsTotal, "Renewals of held locks, by the watchdog or Extend.", Counter, []string{LabelClass}},
	{RenewalFailuresTotal, "Renewals that failed, by reason; redis_error ones are retried while the lock is valid.", Counter, []string{LabelClass, LabelReason}},
	{LocksLostTotal, "Held locks lost before their release, by reason: mutual exclusion may have been broken.", Counter, []string{LabelClass, LabelReason}},
	{HoldDurationSeconds, "Time from acquisition to release or loss.", Histogram, []string{LabelClass}},
	{LocksHeld, "Locks held by this process now.", Gauge, []string{LabelClass}},
	{OldestLockAcquiredTimestampSeconds, "Unix time of the acquisition of the oldest lock this process holds; 0 when it holds none.", Gauge, []string{LabelClass}},
	{Waiters, "Acquire calls waiting for a lock held by someone else now.", Gauge, []string{LabelClass}},
	{ForceReleasesTotal, "Locks removed by ForceRelease from this process (an operator's action), whoever held them.", Counter, []string{LabelClass}},
}

// Exporter lists the metrics cmd/exporter serves. Its scans run in the
// background; scrapes serve the last result.
var Exporter = []Desc{
	{LockKeys, "Lock keys found by the last background scan of every master.", Gauge, []string{LabelClass}},
	{LockKeysWithoutExpiry, "Lock keys with no TTL found by the last background scan: leaked, they can never expire.", Gauge, []string{LabelClass}},
	{LockKeysOverdue, "Lock keys whose token says they were acquired longer ago than the overdue threshold (last background scan).", Gauge, []string{LabelClass}},
	{LockKeyOldestAcquiredSeconds, "Unix time of the acquisition of the oldest lock key found by the last background scan; 0 when none.", Gauge, []string{LabelClass}},
	{ScanUp, "1 when the last background scan reached every master without error, else 0.", Gauge, nil},
	{ScanDurationSeconds, "Duration of the last background scan.", Gauge, nil},
	{ScanKeysExamined, "Keys the last background scan examined.", Gauge, nil},
	{ScanTruncated, "1 when the last background scan stopped at its key cap or deadline, else 0.", Gauge, nil},
	{ScanErrors, "Errors in the last background scan.", Gauge, nil},
	{ScanLastSuccessTimestamp, "Unix time the last complete background scan ended.", Gauge, nil},
	{ScanSkippedKeys, "Keys under the lock prefix the last background scan could not read as lock keys, by reason; they are left alone.", Gauge, []string{LabelReason}},
	{RedisOpsPerSecond, "A master's instantaneous_ops_per_sec from INFO, at the last scan.", Gauge, []string{LabelMaster}},
	{RedisConnectedClients, "A master's connected_clients from INFO, at the last scan.", Gauge, []string{LabelMaster}},
	{RedisBlockedClients, "A master's blocked_clients from INFO, at the last scan.", Gauge, []string{LabelMaster}},
	{RedisEvictedKeysTotal, "A master's evicted_keys from INFO, at the last scan.", Counter, []string{LabelMaster}},
	{RedisExpiredKeysTotal, "A master's expired_keys from INFO, at the last scan.", Counter, []string{LabelMaster}},
	{ProbeSuccess, "1 when the last synthetic acquire and release on the master succeeded, else 0.", Gauge, []string{LabelMaster}},
	{ProbeDurationSeconds, "Duration of the last synthetic acquire and release on the master.", Gauge, []string{LabelMaster}},
}

// Names returns every metric name of descs, with the series suffixes of
// histograms (_bucket, _sum, _count), for checking queries against.
func Names(descs ...[]Desc) map[string]bool {
	names := map[string]bool{}
	for _, ds := range descs {
		for _, d := range ds {
			names[d.Name] = true
			if d.Type == Histogram {
				names[d.Name+"_bucket"] = true
				names[d.Name+"_sum"] = true
				names[d.Name+"_count"] = true
			}
		}
	}
	return names
}
