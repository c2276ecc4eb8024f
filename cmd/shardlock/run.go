package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/shardlock/shardlock/internal/cliflags"
	"github.com/shardlock/shardlock/manager"
)

// Exit codes, for scripts.
const (
	exitOK       = 0 // done
	exitFailed   = 1 // Redis could not be reached, or failed
	exitUsage    = 2 // bad flags or arguments
	exitNotFound = 3 // show or release of a resource nobody holds
	exitRefused  = 4 // release of a key that holds something else than a shardlock token
)

const envPrefix = "SHARDLOCK_CLI_"

const usage = `Usage: shardlock [flags] COMMAND [command flags] [RESOURCE]

Commands:
  list     list the locks held (every master of a cluster), optionally by
           resource prefix (-prefix) or class (-class: the namespace,
           "order" for order:123, as the metrics name it)
  show     show one lock: holder, since when, TTL, fence, waiters
  release  remove a lock whoever holds it: -force and -reason are required;
           the holder's next renewal or release then fails with the reason

Output (list, show): -o table (default) or -o json (one object per lock).

Exit codes: 0 done, 1 Redis failed, 2 bad usage, 3 no such lock,
4 the key holds something that is not a shardlock token (left alone).

Flags (each also read from SHARDLOCK_CLI_<FLAG>, e.g. SHARDLOCK_CLI_REDIS_ADDR):
`

// run runs one command and returns its exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var rf cliflags.Redis
	fs := flag.NewFlagSet("shardlock", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rf.Register(fs, "required")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline of the whole command")
	owner := fs.String("owner", "shardlock-cli", "owner id recorded by release -force")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := cliflags.ApplyEnv(fs, envPrefix); err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	if rf.Addr == "" {
		fmt.Fprintln(stderr, "shardlock: -redis.addr (or SHARDLOCK_CLI_REDIS_ADDR) is required")
		return exitUsage
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	sub := flag.NewFlagSet("shardlock "+cmd, flag.ContinueOnError)
	sub.SetOutput(stderr)
	output := sub.String("o", "table", "output: table or json")
	prefix := sub.String("prefix", "", "list: resources starting with this")
	class := sub.String("class", "", "list: locks of this class: the resource's namespace, as the library and the exporter name it (\"order\" for order:123)")
	force := sub.Bool("force", false, "release: required, to say it is meant")
	reason := sub.String("reason", "", "release: why, recorded for the evicted holder and logged")
	if err := sub.Parse(rest); err != nil {
		return exitUsage
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "shardlock: -o %q: want table or json\n", *output)
		return exitUsage
	}
	// Every argument is checked before anything is sent.
	if !checkArgs(cmd, sub.NArg(), *force, *reason, stderr) {
		if cmd != "list" && cmd != "show" && cmd != "release" {
			fs.Usage()
		}
		return exitUsage
	}
	client, err := rf.Client()
	if err != nil {
		fmt.Fprintln(stderr, "shardlock:", err)
		return exitUsage
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	m, err := manager.New(ctx, client, manager.WithKeyPrefix(rf.Prefix), manager.WithOwner(*owner), manager.WithWatchdog(false))
	if err != nil {
		fmt.Fprintln(stderr, "shardlock:", err)
		return exitFailed
	}
	defer m.Close(context.WithoutCancel(ctx))
	switch cmd {
	case "list":
		return list(ctx, m, manager.ListOptions{Prefix: *prefix, Class: *class}, *output, stdout, stderr)
	case "show":
		return show(ctx, m, sub.Arg(0), *output, stdout, stderr)
	}
	return release(ctx, m, sub.Arg(0), *reason, stdout, stderr)
}

// checkArgs reports whether command cmd has what it needs: nargs
// resources, and for release -force and a reason; it says what is wrong on
// stderr.
func checkArgs(cmd string, nargs int, force bool, reason string, stderr io.Writer) bool {
	switch cmd {
	case "list":
		if nargs != 0 {
			fmt.Fprintln(stderr, "shardlock list: takes no resource")
			return false
		}
	case "show":
		if nargs != 1 {
			fmt.Fprintln(stderr, "shardlock show: want one RESOURCE")
			return false
		}
	case "release":
		if nargs != 1 || !force || reason == "" {
			fmt.Fprintln(stderr, "shardlock release: want -force -reason TEXT RESOURCE")
			return false
		}
	default:
		fmt.Fprintf(stderr, "shardlock: unknown command %q\n", cmd)
		return false
	}
	return true
}

// lockJSON is a lock as -o json prints it.
type lockJSON struct {
	Resource   string    `json:"resource"`
	Key        string    `json:"key"`
	Held       bool      `json:"held"`
	Foreign    bool      `json:"foreign,omitempty"`
	Owner      string    `json:"owner,omitempty"`
	AcquiredAt time.Time `json:"acquired_at,omitzero"`
	TTLSeconds float64   `json:"ttl_seconds"`
	Fence      uint64    `json:"fence"`
	Waiters    int       `json:"waiters"`
	OldestWait float64   `json:"oldest_wait_seconds,omitempty"`
	ReadWrite  bool      `json:"read_write,omitempty"`
	Readers    int       `json:"readers,omitempty"`
}

func toJSON(i manager.LockInfo) lockJSON {
	return lockJSON{Resource: i.Resource, Key: i.Key, Held: i.Held, Foreign: i.Foreign, Owner: i.Owner, AcquiredAt: i.AcquiredAt,
		TTLSeconds: i.TTL.Seconds(), Fence: i.Fence, Waiters: i.Waiters, OldestWait: i.OldestWait.Seconds(),
		ReadWrite: i.ReadWrite, Readers: i.Readers}
}

func table(w io.Writer) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tOWNER\tHELD FOR\tTTL\tFENCE\tWAITERS")
	return tw
}

func row(tw *tabwriter.Writer, i manager.LockInfo) {
	owner, held := i.Owner, "-"
	switch {
	case i.Foreign:
		owner = "(not a shardlock token)"
	case i.ReadWrite && owner != "":
		owner += " (writer)"
	case i.ReadWrite:
		owner = fmt.Sprintf("(%d readers)", i.Readers)
	}
	if !i.AcquiredAt.IsZero() {
		held = time.Since(i.AcquiredAt).Round(time.Millisecond).String()
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", i.Resource, owner, held, i.TTL.Round(time.Millisecond), i.Fence, i.Waiters)
}

func list(ctx context.Context, m *manager.Manager, opts manager.ListOptions, output string, stdout, stderr io.Writer) int {
	enc := json.NewEncoder(stdout)
	var tw *tabwriter.Writer
	if output == "table" {
		tw = table(stdout)
	}
	for info, err := range m.List(ctx, opts) {
		if err != nil {
			if tw != nil {
				_ = tw.Flush()
			}
			fmt.Fprintln(stderr, err)
			return exitFailed
		}
		if tw != nil {
			row(tw, info)
		} else if err := enc.Encode(toJSON(info)); err != nil {
			return exitFailed
		}
	}
	if tw != nil {
		_ = tw.Flush()
	}
	return exitOK
}

func show(ctx context.Context, m *manager.Manager, resource, output string, stdout, stderr io.Writer) int {
	info, err := m.Inspect(ctx, resource)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, manager.ErrInvalidArgument) {
			return exitUsage
		}
		return exitFailed
	}
	if output == "json" {
		_ = json.NewEncoder(stdout).Encode(toJSON(info))
	} else {
		tw := table(stdout)
		row(tw, info)
		_ = tw.Flush()
	}
	if !info.Held {
		return exitNotFound
	}
	return exitOK
}

func release(ctx context.Context, m *manager.Manager, resource, reason string, stdout, stderr io.Writer) int {
	err := m.ForceRelease(ctx, resource, reason)
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "released %s\n", resource)
		return exitOK
	case errors.Is(err, manager.ErrExpired):
		fmt.Fprintf(stderr, "shardlock: nobody holds %s\n", resource)
		return exitNotFound
	case errors.Is(err, manager.ErrNotHeld):
		fmt.Fprintln(stderr, err)
		return exitRefused
	case errors.Is(err, manager.ErrInvalidArgument):
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	fmt.Fprintln(stderr, err)
	return exitFailed
}
