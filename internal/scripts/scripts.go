// Package scripts holds shardlock's Lua scripts, embedded from .lua files
// and compiled once. Run them with Script.Run (EVALSHA with EVAL fallback);
// in pipelines, load them first (All) and retry NOSCRIPT with EVAL.
package scripts

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire_fenced.lua
	acquireFencedSrc string
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

// The scripts. Their contracts are in the .lua files.
var (
	AcquireFenced = redis.NewScript(acquireFencedSrc)
	Release       = redis.NewScript(releaseSrc)
	AcquireQueue  = redis.NewScript(acquireQueueSrc)
	Extend        = redis.NewScript(extendSrc)
	PTTL          = redis.NewScript(pttlSrc)
	AcquireBatch  = redis.NewScript(acquireBatchSrc)
	ReleaseBatch  = redis.NewScript(releaseBatchSrc)
	ExtendBatch   = redis.NewScript(extendBatchSrc)
	PTTLBatch     = redis.NewScript(pttlBatchSrc)
)

// All lists every script, for preloading.
func All() []*redis.Script {
	return []*redis.Script{AcquireFenced, Release, AcquireQueue, Extend, PTTL, AcquireBatch, ReleaseBatch, ExtendBatch, PTTLBatch}
}
