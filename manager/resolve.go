package manager

import (
	"strconv"

	"github.com/shardlock/shardlock/metrics"
	"github.com/shardlock/shardlock/sharding"
)

// resolveClass sets ac.cls, the metrics class of an acquire of resource.
func (m *Manager) resolveClass(ac *acquireConfig, resource string) {
	if m.mx == nil {
		return
	}
	name := ac.class
	if name == "" {
		name = m.className(resource)
	}
	ac.cls = m.mx.Class(name)
}

// className is the metrics class of resource's locks, as acquires name it
// without WithClass.
func (m *Manager) className(resource string) (class string) {
	defer func() {
		if recover() != nil {
			class = metrics.ClassDefault // a class function that panics names nothing
		}
	}()
	if m.cfg.classFunc != nil {
		if c := m.cfg.classFunc(resource); c != "" {
			return c
		}
		return metrics.ClassDefault
	}
	return metrics.ClassOf(resource)
}

// defaultAcquireConfig is the acquire configuration without options, made
// (and validated) once by New.
func (m *Manager) defaultAcquireConfig() acquireConfig {
	ac := acquireConfig{
		ttl: m.cfg.ttl, wait: m.cfg.wait, retry: m.cfg.retry, retrySet: m.cfg.retrySet, fencing: m.cfg.fencing,
		maxHold: m.cfg.maxHold, watchdog: m.cfg.watchdog, interval: m.cfg.renewInterval,
		ttlMs: strconv.FormatInt(m.cfg.ttl.Milliseconds(), 10),
	}
	if ac.interval == 0 {
		ac.interval = ac.ttl / 3
	}
	return ac
}

// lockKey checks resource and returns its lock key.
func (m *Manager) lockKey(resource string) (string, error) {
	if len(resource) > MaxResourceLen {
		return "", resourceTooLong(resource)
	}
	key, err := sharding.LockKey(m.cfg.prefix, resource)
	if err != nil {
		return "", invalid("resource", "%q: %v", resource, err)
	}
	return key, nil
}

// lockKeys appends the lock keys of resources to dst, checked as lockKey
// checks one: one allocation for the keys however many there are, and none
// for the slice where dst has room (see sharding.AppendLockKeys).
func (m *Manager) lockKeys(dst, resources []string) ([]string, error) {
	for _, r := range resources {
		if len(r) > MaxResourceLen {
			return nil, resourceTooLong(r)
		}
	}
	keys, err := sharding.AppendLockKeys(dst, m.cfg.prefix, resources)
	if err != nil {
		for _, r := range resources {
			if _, err := m.lockKey(r); err != nil {
				return nil, err // the error a lock on r alone gets
			}
		}
		return nil, invalid("resource", "%v", err)
	}
	return keys, nil
}

func resourceTooLong(resource string) error {
	return invalid("resource", "%d bytes, more than %d", len(resource), MaxResourceLen)
}

// acquireConfig returns resource's lock key and acquireOptions(opts).
func (m *Manager) acquireConfig(resource string, opts []AcquireOption) (acquireConfig, string, error) {
	key, err := m.lockKey(resource)
	if err != nil {
		return acquireConfig{}, "", err
	}
	ac, err := m.acquireOptions(opts)
	return ac, key, err
}

// acquireOptions returns the manager's acquire defaults with opts applied,
// checked.
func (m *Manager) acquireOptions(opts []AcquireOption) (acquireConfig, error) {
	if len(opts) == 0 {
		return m.defaultAC, nil // validated by New
	}
	// Options apply to a heap copy (they are interfaces), so the common call
	// without options allocates nothing here.
	p := new(acquireConfig)
	*p = m.defaultAC
	p.interval = m.cfg.renewInterval // 0 (TTL/3) is resolved after the options
	for _, o := range opts {
		if o != nil {
			o.applyAcquire(p)
		}
	}
	ac := *p
	if err := checkTTL(ac.ttl); err != nil {
		return ac, err
	}
	if err := checkWait(ac.wait); err != nil {
		return ac, err
	}
	if err := checkRetry(ac.retry); err != nil {
		return ac, err
	}
	if ac.maxHold < 0 {
		return ac, invalid("max hold", "%v is negative", ac.maxHold)
	}
	if err := checkRenew(ac.interval, ac.ttl); err != nil {
		return ac, err
	}
	if ac.interval == 0 {
		ac.interval = ac.ttl / 3
	}
	if ac.ttl != m.cfg.ttl {
		ac.ttlMs = strconv.FormatInt(ac.ttl.Milliseconds(), 10)
	}
	if m.cfg.replicas > 0 && m.cfg.replicaTimeout >= ac.ttl {
		return ac, invalid("ttl", "%v must exceed the replica ack timeout %v", ac.ttl, m.cfg.replicaTimeout)
	}
	return ac, nil
}
