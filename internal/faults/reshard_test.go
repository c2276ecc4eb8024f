package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/slotmap"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/sharding"
)

// reshards is how many times the redis-cli reshard case runs (each with
// redis-cli's defaults and with --cluster-pipeline 1): CI runs it once;
// scripts/migrations.sh runs it RESHARDS times in a row.
var reshards = flag.Int("reshards", 1, "runs of the redis-cli reshard case")

// workerEnv names the environment variable that makes the test binary a
// workload worker (see TestMain): its value is a workerSpec in JSON.
const workerEnv = "SHARDLOCK_FAULTS_WORKER"

// workerSpec is what a worker process runs: a workload on the cluster at
// Addrs, for For, its report written to Out.
type workerSpec struct {
	Addrs, Resources  []string
	Managers, Workers int
	For               time.Duration
	Out               string
}

// workerReport is what a worker process saw, for the parent to check.
type workerReport struct {
	Sections   []reportedSection
	Errs       []string
	Lost       int
	LostWhy    []string
	Replies    map[string]int
	Goroutines int
}

type reportedSection struct {
	Resource   string
	Fence      uint64
	Start, End int64 // the wall clock, in ns: one clock for every process of the machine
	Read       bool
}

// runWorker runs the workload that the environment describes, prints
// "ready" once its managers are made, and writes its report. It returns
// the process's exit code.
func runWorker(spec string) int {
	var s workerSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, "worker spec:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.For)
	defer cancel()
	var w workload
	ready := make(chan struct{})
	go func() {
		defer close(ready)
		select {
		case <-w.started():
			fmt.Println("ready")
		case <-ctx.Done():
		}
	}()
	w.run(ctx, s.Addrs, s.Resources, s.Managers, s.Workers)
	<-ready
	rep := workerReport{Lost: w.lost, LostWhy: w.lostWhy, Replies: w.replies, Goroutines: w.goroutines}
	for _, sec := range w.sections {
		rep.Sections = append(rep.Sections, reportedSection{sec.resource, sec.fence, sec.start.UnixNano(), sec.end.UnixNano(), sec.read})
	}
	for _, err := range w.errs {
		rep.Errs = append(rep.Errs, err.Error())
	}
	b, err := json.Marshal(rep)
	if err == nil {
		err = os.WriteFile(s.Out, b, 0o600)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker report:", err)
		return 2
	}
	return 0
}

// A real `redis-cli --cluster reshard`, with its defaults and with
// --cluster-pipeline 1 (one key per MIGRATE), moves the slot of contended
// exclusive locks (fenced and not), a fenced batch and a read-write lock
// while three processes lock and release them: the reshard exits 0 (no
// key is on both nodes: MIGRATE without REPLACE meets no BUSYKEY), no call
// fails, no critical sections overlap, no lock is lost, fences rise.
func TestReshard(t *testing.T) {
	addrs := testenv.FaultClusterAddrs(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli: %v (scripts/redis-test-env.sh installs it)", err)
	}
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer admin.Close()
	for run := range max(*reshards, 1) {
		for _, pipeline := range []int{0, 1} {
			name := fmt.Sprintf("defaults/%d", run+1)
			if pipeline > 0 {
				name = fmt.Sprintf("pipeline %d/%d", pipeline, run+1)
			}
			t.Run(name, func(t *testing.T) { reshardUnderLoad(t, cli, addrs, admin, pipeline) })
		}
	}
}

// reshardUnderLoad moves one slot with redis-cli (--cluster-pipeline
// pipeline; 0: its default) under a workload of three processes on it.
func reshardUnderLoad(t *testing.T, cli string, addrs []string, admin *redis.ClusterClient, pipeline int) {
	ctx := context.Background()
	waitClusterOK(t, addrs, 60*time.Second)
	admin.ReloadState(ctx)
	slots, err := slotmap.Read(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	// redis-cli moves a source's lowest slots first: the load goes there.
	source := slots.Masters()[0]
	slot := sharding.SlotCount
	for _, r := range slots {
		if r.Master == source && r.Start < slot {
			slot = r.Start
		}
	}
	tag := tagInSlot(t, slot)
	target := otherMaster(t, ctx, admin, source)
	src, dst := node(source), node(target)
	defer src.Close()
	defer dst.Close()
	srcID, _ := src.Do(ctx, "cluster", "myid").Text()
	dstID, _ := dst.Do(ctx, "cluster", "myid").Text()

	res := []string{"nf:{" + tag + "}:a", "nf:{" + tag + "}:b", "{" + tag + "}:c", "{" + tag + "}:d",
		"{" + tag + "}:x,{" + tag + "}:y", "rw:{" + tag + "}:e"}
	// Keys of another application in the slot, so that the reshard takes
	// a while: lock keys and their helpers move at different moments.
	pipe := admin.Pipeline()
	for i := range reshardFiller {
		pipe.Set(ctx, fmt.Sprintf("{%s}:filler:%d", tag, i), "x", time.Minute)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	workers := startWorkers(t, workerSpec{Addrs: addrs, Resources: res, Managers: 2, Workers: len(res), For: 5 * time.Second}, 3)
	time.Sleep(time.Second) // the load runs a second before the reshard

	args := []string{"--cluster", "reshard", source, "--cluster-from", srcID, "--cluster-to", dstID,
		"--cluster-slots", "1", "--cluster-yes"}
	if pipeline > 0 {
		args = append(args, "--cluster-pipeline", strconv.Itoa(pipeline))
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	out, rerr := exec.CommandContext(rctx, cli, args...).CombinedOutput()
	cancel()
	w := workers.wait(t)
	if rerr != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), rerr, out)
	}
	admin.ReloadState(ctx)
	if now, _ := masterOf(t, ctx, admin, slot); now != target {
		t.Fatalf("slot %d is on %s after the reshard, not %s\n%s", slot, now, target, out)
	}
	if moved := fmt.Sprintf("Moving slot %d from %s to %s", slot, source, target); !strings.Contains(string(out), moved) {
		t.Errorf("redis-cli did not say %q:\n%s", moved, out)
	}
	w.check(t, noLoss)
}

// reshardFiller is how many keys of another application share the
// resharded slot with the locks.
const reshardFiller = 2000

// tagInSlot returns a fresh hash tag whose keys live in slot.
func tagInSlot(t *testing.T, slot int) string {
	t.Helper()
	for range 1 << 20 {
		if tag := testenv.Unique("rs"); sharding.Slot(tag) == slot {
			return tag
		}
	}
	t.Fatalf("no tag found for slot %d", slot)
	return ""
}

// workerProcs are the worker processes of one run.
type workerProcs struct {
	cmds []*exec.Cmd
	outs []string
}

// startWorkers starts n worker processes (this test binary, see
// TestMain) running spec, and returns once each has made its managers.
func startWorkers(t *testing.T, spec workerSpec, n int) *workerProcs {
	t.Helper()
	wp := &workerProcs{}
	dir := t.TempDir()
	ready := make(chan error, n)
	for i := range n {
		spec.Out = filepath.Join(dir, fmt.Sprintf("worker-%d.json", i))
		b, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+string(b))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wp.cmds, wp.outs = append(wp.cmds, cmd), append(wp.outs, spec.Out)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if sc.Text() == "ready" {
					ready <- nil
					break
				}
			}
			// Read the rest, so the worker never blocks on a full pipe.
			for sc.Scan() {
			}
			if sc.Err() != nil {
				ready <- sc.Err()
			}
		}()
	}
	timeout := time.After(30 * time.Second)
	for range n {
		select {
		case err := <-ready:
			if err != nil {
				t.Fatal(err)
			}
		case <-timeout:
			wp.kill()
			t.Fatal("the workers were not ready within 30 s")
		}
	}
	return wp
}

func (wp *workerProcs) kill() {
	for _, c := range wp.cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
}

// wait waits for every worker to end and merges their reports.
func (wp *workerProcs) wait(t *testing.T) *workload {
	t.Helper()
	w := &workload{replies: map[string]int{}}
	for i, c := range wp.cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
		b, err := os.ReadFile(wp.outs[i])
		if err != nil {
			t.Fatal(err)
		}
		var rep workerReport
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		for _, s := range rep.Sections {
			w.sections = append(w.sections, section{resource: s.Resource, fence: s.Fence,
				start: time.Unix(0, s.Start), end: time.Unix(0, s.End), read: s.Read})
		}
		for _, e := range rep.Errs {
			w.errs = append(w.errs, fmt.Errorf("worker %d: %w", i, errors.New(e)))
		}
		w.lost += rep.Lost
		w.lostWhy = append(w.lostWhy, rep.LostWhy...)
		w.goroutines += rep.Goroutines
		for k, v := range rep.Replies {
			w.replies[k] += v
		}
	}
	return w
}
