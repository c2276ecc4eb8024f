package scripts

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shardlock/shardlock/sharding"
)

// The three scripts of the fair queue carry handover.lua in place of their
// include line, after their own fast path where they have one.
func TestInclude(t *testing.T) {
	for name, src := range map[string]string{"release": releaseSrc, "release_batch": releaseBatchSrc, "acquire_queue": acquireQueueSrc} {
		got := include(src)
		if strings.Contains(got, includePrefix) || !strings.Contains(got, "local function hand_over(k)") {
			t.Errorf("%s: handover.lua not included", name)
		}
		if strings.Count(got, "local function take_fence(fk)") != 1 {
			t.Errorf("%s: fence.lua not included once", name)
		}
	}
	for name, src := range map[string]string{"acquire_fenced": acquireFencedSrc, "acquire_batch": acquireBatchSrc} {
		if got := include(src); strings.Contains(got, includePrefix) || strings.Count(got, "local function take_fence(fk)") != 1 {
			t.Errorf("%s: fence.lua not included once", name)
		}
	}
	rel := include(releaseSrc)
	if strings.Index(rel, "redis.call('DEL', k)\n  return 1") > strings.Index(rel, "local function grant") {
		t.Error("release.lua: the uncontended path runs after the hand-over's definitions")
	}
}

// handover.lua's claim lease is ClaimLease, which the waiters' validity
// and re-checks are computed from.
func TestClaimLeaseMatches(t *testing.T) {
	want := fmt.Sprintf("local claim_ms = %d\n", ClaimLease.Milliseconds())
	if !strings.Contains(handoverSrc, want) {
		t.Errorf("handover.lua does not say %q", strings.TrimSpace(want))
	}
}

// The scripts name helper keys and channels only through suffixes.lua's
// names, which are sharding's suffixes.
func TestSuffixesAreShardings(t *testing.T) {
	for _, suffix := range []string{sharding.FenceSuffix, sharding.QueueSuffix, sharding.OutcomeSuffix, sharding.ChannelSuffix} {
		if !strings.Contains(suffixesSrc, fmt.Sprintf("%q", suffix)) {
			t.Errorf("suffixes.lua lacks %q", suffix)
		}
		for name, src := range map[string]string{"handover": handoverSrc, "release": releaseSrc, "release_batch": releaseBatchSrc,
			"acquire_queue": acquireQueueSrc, "acquire_batch": acquireBatchSrc, "acquire_fenced": acquireFencedSrc, "extend": extendSrc} {
			for line := range strings.Lines(src) {
				if !strings.HasPrefix(strings.TrimSpace(line), "--") && strings.Contains(line, "'"+suffix+"'") {
					t.Errorf("%s.lua spells the suffix %q: %s", name, suffix, strings.TrimSpace(line))
				}
			}
		}
	}
	if got := include(releaseSrc); strings.Count(got, "local FENCE_SUFFIX") != 1 {
		t.Error("release.lua: suffixes.lua not included once")
	}
}
