package scripts

import (
	"fmt"
	"os"
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
		if strings.Count(got, "local function take_fence(") != 1 {
			t.Errorf("%s: fence.lua not included once", name)
		}
	}
	for name, src := range map[string]string{"acquire_fenced": acquireFencedSrc, "acquire_batch": acquireBatchSrc} {
		if got := include(src); strings.Contains(got, includePrefix) || strings.Count(got, "local function take_fence(") != 1 {
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
	if want := fmt.Sprintf("local RW_CLAIM = %d ", ClaimLease.Milliseconds()); !strings.Contains(rwSrc, want) {
		t.Errorf("rw.lua does not say %q", strings.TrimSpace(want))
	}
}

// The scripts name helper keys, channels and the queued mark only through
// prelude.lua's names, which are sharding's constants.
func TestSuffixesAreShardings(t *testing.T) {
	for _, suffix := range []string{sharding.FenceSuffix, sharding.QueueSuffix, sharding.ChannelSuffix, sharding.ForcedSuffix} {
		if !strings.Contains(namesSrc, fmt.Sprintf("%q", suffix)) {
			t.Errorf("names.lua lacks %q", suffix)
		}
		for name, src := range map[string]string{"handover": handoverSrc, "release": releaseSrc, "release_batch": releaseBatchSrc,
			"acquire_queue": acquireQueueSrc, "acquire_batch": acquireBatchSrc, "acquire_fenced": acquireFencedSrc, "extend": extendSrc,
			"rw": rwSrc, "rw_acquire": rwAcquireSrc, "rw_release": rwReleaseSrc, "rw_extend": rwExtendSrc, "rw_pttl": rwPTTLSrc, "rw_leave": rwLeaveSrc} {
			for line := range strings.Lines(src) {
				if !strings.HasPrefix(strings.TrimSpace(line), "--") && strings.Contains(line, "'"+suffix+"'") {
					t.Errorf("%s.lua spells the suffix %q: %s", name, suffix, strings.TrimSpace(line))
				}
			}
		}
	}
	if got := include(releaseSrc); strings.Count(got, "local FENCE_SUFFIX") != 1 {
		t.Error("release.lua: names.lua not included once")
	}
	if want := fmt.Sprintf("local QUEUED_MARK = '\\%d'\n", sharding.QueuedMark[0]); !strings.Contains(namesSrc, want) {
		t.Errorf("names.lua does not say %q", want)
	}
	// Every script that reads a lock key's value tests it with is_mine or
	// QUEUED_MARK, never a spelled-out mark.
	all := map[string]string{"handover": handoverSrc, "release": releaseSrc, "release_batch": releaseBatchSrc,
		"acquire_queue": acquireQueueSrc, "acquire_batch": acquireBatchSrc, "acquire_fenced": acquireFencedSrc,
		"extend": extendSrc, "extend_batch": extendBatchSrc, "pttl": pttlSrc, "pttl_batch": pttlBatchSrc, "resume": resumeSrc, "force_release": forceReleaseSrc,
		"rw_acquire": rwAcquireSrc, "rw_release": rwReleaseSrc, "rw_extend": rwExtendSrc, "rw_pttl": rwPTTLSrc, "rw_leave": rwLeaveSrc}
	for name, src := range all {
		for line := range strings.Lines(src) {
			if !strings.HasPrefix(strings.TrimSpace(line), "--") && strings.Contains(line, `\30`) {
				t.Errorf("%s.lua spells the queued mark: %s", name, strings.TrimSpace(line))
			}
		}
		if got := include(src); !strings.Contains(got, "local QUEUED_MARK") {
			t.Errorf("%s.lua does not include names.lua", name)
		}
	}
	// And what runs is the included source.
	goSrc, err := os.ReadFile("scripts.go")
	if err != nil {
		t.Fatal(err)
	}
	if n, m := strings.Count(string(goSrc), "redis.NewScript("), strings.Count(string(goSrc), "redis.NewScript(include("); n != m || n != len(All()) {
		t.Errorf("%d scripts, %d made with NewScript, %d of them from include(...)", len(All()), n, m)
	}
}
