package manager_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// handoffChildEnv, when set in a test binary's environment, makes it a
// process of a fleet hand-over run (benchHandoffFleet) instead of running
// tests: the variable holds the process's handoffChildConfig.
const handoffChildEnv = "SHARDLOCK_HANDOFF_CHILD"

// handoffChildConfig is what a fleet process is told: the cluster, the
// mode, its manager's index (its owner id), the number of processes, its
// number of goroutines, the resource, the shared counter's file and the
// run's number of acquisitions.
type handoffChildConfig struct {
	Addrs      []string
	Mode       string
	Index      int
	Procs      int
	Goroutines int
	Resource   string
	Counter    string
	N          int64
}

// handoffChildResult is what a fleet process reports on its last line of
// output: its goroutines' tallies, its CPU time over the run (negative:
// not known) and its error, if any.
type handoffChildResult struct {
	Tallies []handoffTally
	CPU     time.Duration
	Err     string
}

// benchHandoffFleet runs one split of BenchmarkContendedHandoff over procs
// child processes of one manager and perProc goroutines each. Each process
// makes its client and manager and says "ready"; once all are, the run
// starts with a "go" to each, and they take acquisitions from one counter
// shared through a file until the run's b.N are taken.
func benchHandoffFleet(b *testing.B, addrs []string, admin *redis.ClusterClient, name string, procs, perProc int, mode string) {
	b.Run(name, func(b *testing.B) {
		counter := filepath.Join(b.TempDir(), "counter")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		res := testenv.Unique("handoff")
		type child struct {
			cmd *exec.Cmd
			in  *os.File
			out *bufio.Reader
		}
		children := make([]child, procs)
		for i := range children {
			cfg, err := json.Marshal(handoffChildConfig{Addrs: addrs, Mode: mode, Index: i, Procs: procs, Goroutines: perProc, Resource: res, Counter: counter, N: int64(b.N)})
			if err != nil {
				b.Fatal(err)
			}
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), handoffChildEnv+"="+string(cfg))
			cmd.Stderr = os.Stderr
			cmd.WaitDelay = 10 * time.Second
			inR, inW, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			outR, outW, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			cmd.Stdin, cmd.Stdout = inR, outW
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			_ = inR.Close()
			_ = outW.Close()
			children[i] = child{cmd: cmd, in: inW, out: bufio.NewReader(outR)}
			b.Cleanup(func() {
				_ = inW.Close()
				_ = outR.Close()
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
			})
		}
		for _, c := range children {
			if line, err := c.out.ReadString('\n'); err != nil || line != "ready\n" {
				b.Fatalf("fleet process: %q, %v", line, err)
			}
		}
		servers := benchkit.ServersOf(b, admin)
		before := commandCalls(b, admin)
		b.ResetTimer()
		measured := benchkit.MeasureFleet(servers)
		for _, c := range children {
			if _, err := c.in.WriteString("go\n"); err != nil {
				b.Fatal(err)
			}
		}
		results := make([]handoffChildResult, procs)
		var wg sync.WaitGroup
		for i, c := range children {
			wg.Go(func() {
				line, err := c.out.ReadString('\n')
				if err == nil {
					err = json.Unmarshal([]byte(line), &results[i])
				}
				if err != nil {
					results[i].Err = fmt.Sprintf("fleet process %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		var (
			tallies []handoffTally
			cpu     time.Duration
		)
		for i, c := range children {
			if err := c.cmd.Wait(); err != nil && results[i].Err == "" {
				results[i].Err = fmt.Sprintf("fleet process %d: %v", i, err)
			}
			if results[i].Err != "" {
				b.Fatal(results[i].Err)
			}
			tallies = append(tallies, results[i].Tallies...)
			if cpu >= 0 && results[i].CPU >= 0 {
				cpu += results[i].CPU
			} else {
				cpu = -1
			}
		}
		n := reportHandoff(b, admin, before, tallies)
		measured(b, n, cpu) // per acquisition
	})
}

// handoffChild is a fleet process of benchHandoffFleet: cfg is its
// handoffChildConfig. Its output is "ready", once its manager is made,
// then, after the "go" on its input, its handoffChildResult. It returns
// the process's exit code.
func handoffChild(cfg string) int {
	var c handoffChildConfig
	res := handoffChildResult{CPU: -1}
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		res.Err = fmt.Sprintf("fleet process %d: %v", c.Index, err)
		_ = out.Encode(res)
		return 1
	}
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		return fail(err)
	}
	counter, err := benchkit.OpenCounter(c.Counter)
	if err != nil {
		return fail(err)
	}
	defer counter.Close()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ContextTimeoutEnabled: true})
	defer client.Close()
	more := func() bool { return counter.Add(1) <= c.N }
	var loop func(t *handoffTally) error // one goroutine's
	if c.Mode == handoffFloorMode {
		f, err := newHandoffFloor(client, c)
		if err != nil {
			return fail(err)
		}
		defer f.close()
		loop = f.loop
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		m, err := manager.New(ctx, client, handoffOptions(c.Mode, c.Index)...)
		cancel()
		if err != nil {
			return fail(err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = m.Close(ctx)
		}()
		loop = func(t *handoffTally) error { return handoffLoop(m, c.Resource, more, t) }
	}
	if _, err := os.Stdout.WriteString("ready\n"); err != nil {
		return 1
	}
	if line, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil || line != "go\n" {
		return 1 // the benchmark gave up
	}
	cpu0, ok := benchkit.SelfCPU()
	res.Tallies = make([]handoffTally, c.Goroutines)
	errs := make([]error, c.Goroutines)
	var wg sync.WaitGroup
	for g := range res.Tallies {
		wg.Go(func() { errs[g] = loop(&res.Tallies[g]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	if cpu, ok2 := benchkit.SelfCPU(); ok && ok2 {
		res.CPU = cpu - cpu0
	}
	if err := out.Encode(res); err != nil {
		return 1
	}
	return 0
}
