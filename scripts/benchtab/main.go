// Command benchtab reads `go test -bench` output (several runs of the same
// benchmarks, interleaved) and prints a Markdown table of the median of each
// benchmark with its ratio to a baseline in the same run set.
//
//	go run ./scripts/benchtab -base floor < bench.txt
//
// A benchmark name's last element is the implementation (floor,
// floor-autopipeline, shardlock, ...); rows group the names that share the
// rest. Each row shows every implementation's median ops/s, ns/op, B/op,
// allocs/op, CPU time per operation (client and servers) and the servers'
// read system calls per operation ("-" where the benchmark reports none),
// and the ratio of shardlock's ops/s to each floor (of its
// ns/op, for benchmarks that report no ops/s). A group without that
// implementation (a benchmark that compares within itself, reporting its
// own ratio) gets the median of every metric it reports.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

var line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

type sample struct{ metrics map[string]float64 }

func main() {
	impl := flag.String("impl", "shardlock", "the implementation compared with the baselines")
	flag.Parse()
	if err := run(os.Stdin, os.Stdout, *impl); err != nil {
		fmt.Fprintln(os.Stderr, "benchtab:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer, impl string) error {
	samples := map[string][]sample{}
	var order []string
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		f := strings.Fields(m[2])
		s := sample{metrics: map[string]float64{}}
		for i := 0; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				s.metrics[f[i+1]] = v
			}
		}
		if _, ok := samples[m[1]]; !ok {
			order = append(order, m[1])
		}
		samples[m[1]] = append(samples[m[1]], s)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	median := func(name, unit string) float64 {
		var vs []float64
		for _, s := range samples[name] {
			if v, ok := s.metrics[unit]; ok {
				vs = append(vs, v)
			}
		}
		if len(vs) == 0 {
			return 0
		}
		slices.Sort(vs)
		return vs[len(vs)/2]
	}
	type row struct {
		group string
		impls []string
	}
	var rows []row
	for _, name := range order {
		i := strings.LastIndex(name, "/")
		if i < 0 {
			continue
		}
		group, im := name[:i], name[i+1:]
		if len(rows) == 0 || rows[len(rows)-1].group != group {
			rows = append(rows, row{group: group})
		}
		rows[len(rows)-1].impls = append(rows[len(rows)-1].impls, im)
	}
	for _, r := range rows {
		if !slices.Contains(r.impls, impl) {
			printMedians(out, r.group, r.impls, samples, median)
			continue
		}
		printCompared(out, r.group, r.impls, impl, samples, median)
	}
	return nil
}

// printCompared prints the medians of the benchmarks group/name, a row per
// name, each with impl's ratio to it: of ops/s for benchmarks that report
// it (throughput), else of ns/op (latency).
func printCompared(out io.Writer, group string, names []string, impl string, samples map[string][]sample, median func(name, unit string) float64) {
	unit := "ops/s"
	if median(group+"/"+impl, unit) == 0 {
		unit = "ns/op"
	}
	fmt.Fprintf(out, "\n%s (median of %d runs)\n\n", strings.TrimPrefix(group, "Benchmark"), len(samples[group+"/"+names[0]]))
	fmt.Fprintln(out, "| implementation | ops/s | ns/op | B/op | allocs/op | client CPU µs/op | server CPU µs/op | server reads/op | "+impl+" ÷ this ("+unit+") |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	mine := median(group+"/"+impl, unit)
	for _, im := range names {
		n := group + "/" + im
		v := median(n, unit)
		ratio := "-"
		if im != impl && v > 0 && mine > 0 {
			ratio = fmt.Sprintf("%.2fx", mine/v)
		}
		opt := func(unit, format string) string {
			if !reports(samples[n], unit) {
				return "-"
			}
			return fmt.Sprintf(format, median(n, unit))
		}
		fmt.Fprintf(out, "| %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %s |\n", im, median(n, "ops/s"), median(n, "ns/op"), median(n, "B/op"), median(n, "allocs/op"),
			opt("client-cpu-us/op", "%.2f"), opt("server-cpu-us/op", "%.2f"), opt("server-reads/op", "%.3f"), ratio)
	}
}

// reports reports whether any of ss has a value in unit.
func reports(ss []sample, unit string) bool {
	for _, s := range ss {
		if _, ok := s.metrics[unit]; ok {
			return true
		}
	}
	return false
}

// printMedians prints the median of every metric the benchmarks group/name
// report, a row per name.
func printMedians(out io.Writer, group string, names []string, samples map[string][]sample, median func(name, unit string) float64) {
	var units []string
	for _, n := range names {
		for _, s := range samples[group+"/"+n] {
			for u := range s.metrics {
				if !slices.Contains(units, u) {
					units = append(units, u)
				}
			}
		}
	}
	slices.Sort(units)
	fmt.Fprintf(out, "\n%s (median of %d runs)\n\n", strings.TrimPrefix(group, "Benchmark"), len(samples[group+"/"+names[0]]))
	fmt.Fprintln(out, "| benchmark | "+strings.Join(units, " | ")+" |")
	fmt.Fprintln(out, "|---"+strings.Repeat("|---:", len(units))+"|")
	for _, n := range names {
		row := "| " + n
		for _, u := range units {
			row += " | " + strconv.FormatFloat(median(group+"/"+n, u), 'g', 4, 64)
		}
		fmt.Fprintln(out, row+" |")
	}
}
