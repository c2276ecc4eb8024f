// Package scripts holds shardlock's Lua scripts, embedded from .lua files
// and compiled once. Run them with Script.Run (EVALSHA with EVAL fallback);
// in pipelines, load them first (All) and retry NOSCRIPT with EVAL.
package scripts

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire_fenced.lua
	acquireFencedSrc string
	//go:embed handover.lua
	handoverSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed acquire_queue.lua
	acquireQueueSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed pttl.lua
	pttlSrc string
	//go:embed acquire_batch.lua
	acquireBatchSrc string
	//go:embed release_batch.lua
	releaseBatchSrc string
	//go:embed extend_batch.lua
	extendBatchSrc string
	//go:embed pttl_batch.lua
	pttlBatchSrc string
)

// The scripts. Their contracts are in the .lua files; the fair queue's
// hand-over (handover.lua) goes where a script says "-- #include handover.lua".
var (
	AcquireFenced = redis.NewScript(acquireFencedSrc)
	Release       = redis.NewScript(include(releaseSrc))
	AcquireQueue  = redis.NewScript(include(acquireQueueSrc))
	Extend        = redis.NewScript(extendSrc)
	PTTL          = redis.NewScript(pttlSrc)
	AcquireBatch  = redis.NewScript(acquireBatchSrc)
	ReleaseBatch  = redis.NewScript(include(releaseBatchSrc))
	ExtendBatch   = redis.NewScript(extendBatchSrc)
	PTTLBatch     = redis.NewScript(pttlBatchSrc)
)

// All lists every script, for preloading.
func All() []*redis.Script {
	return []*redis.Script{AcquireFenced, Release, AcquireQueue, Extend, PTTL, AcquireBatch, ReleaseBatch, ExtendBatch, PTTLBatch}
}

// includeLine marks where a script takes handover.lua.
const includeLine = "-- #include handover.lua"

// include puts handover.lua in place of the include line of src (the rest
// of that line is a comment). A script without the line is a bug: panic at
// init, caught by any test.
func include(src string) string {
	i := strings.Index(src, includeLine)
	if i < 0 {
		panic("scripts: no include line")
	}
	end := strings.IndexByte(src[i:], '\n')
	if end < 0 {
		end = len(src) - i
	}
	return src[:i] + handoverSrc + src[i+end:]
}
