package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/elastictrain/elastictrain/examples/internal/ranks"
	"github.com/elastictrain/elastictrain/internal/netns"
	elsync "github.com/elastictrain/elastictrain/sync"
)

// Between hosts (-hosts HxL): the ranks run on H hosts made of Linux
// network namespaces (internal/netns), L per host, each host's link capped
// with tc tbf; ranks 0..L-1 sit on host 0, L..2L-1 on host 1, and so on
// (host-contiguous: the flat ring's best order, crossing each host link
// once). Every round measures each of -impls once, in turn, so that the
// machine's load falls on all of them alike.

func hierarchyOf(s string) elsync.Hierarchy {
	switch s {
	case "auto":
		return elsync.HierarchyAuto
	case "off", "flat":
		return elsync.HierarchyOff
	case "leaders":
		return elsync.HierarchyLeaders
	case "striped":
		return elsync.HierarchyStriped
	}
	return 255
}

// parseHosts parses "HxL" (netns.ParseLayout) for -hosts.
func parseHosts(s string) (hosts, per int, err error) {
	hosts, per, err = netns.ParseLayout(s)
	if err != nil {
		return 0, 0, fmt.Errorf("-hosts: %w", err)
	}
	return hosts, per, nil
}

// parseRate parses "1gbit", "500mbit", "0" into bits per second
// (netns.ParseRate) for -cap.
func parseRate(s string) (int64, error) {
	r, err := netns.ParseRate(s)
	if err != nil {
		return 0, fmt.Errorf("-cap: %w", err)
	}
	return r, nil
}

// impl is one allreduce implementation measured between hosts.
type impl struct {
	name string // leaders, striped, flat, gloo
}

// busBound is the busbw (NCCL-tests: algbw * 2(n-1)/n) an allreduce of n
// ranks on h hosts cannot exceed when each host link carries rate bytes/s
// each way: the flat ring (and Gloo's ring), with host-contiguous ranks,
// sends 2(n-1)/n of the buffer over each host link, so busbw <= rate; the
// hierarchical allreduce sends 2(h-1)/h of it, so busbw <= rate *
// h(n-1) / (n(h-1)).
func busBound(name string, n, h int, rate float64) float64 {
	if h < 2 {
		return 0
	}
	if name == "leaders" || name == "striped" {
		return rate * float64(h*(n-1)) / float64(n*(h-1))
	}
	return rate
}

// runHosts measures every layout of -hosts (comma-separated) in turn.
func runHosts(o options) error {
	var layouts [][2]int
	for _, l := range strings.Split(o.hostsArg, ",") {
		H, L, err := parseHosts(strings.TrimSpace(l))
		if err != nil {
			return err
		}
		layouts = append(layouts, [2]int{H, L})
	}
	for i, l := range layouts {
		if i > 0 && !o.json {
			fmt.Println()
		}
		if err := runLayout(o, l[0], l[1]); err != nil {
			return err
		}
	}
	return nil
}

// runLayout measures H hosts of L ranks.
func runLayout(o options, H, L int) error {
	capBits, err := parseRate(o.capArg)
	if err != nil {
		return err
	}
	var impls []string
	for _, s := range strings.Split(o.impls, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "":
		case "leaders", "striped", "flat", "gloo":
			impls = append(impls, s)
		default:
			return fmt.Errorf("-impls: unknown %q (want leaders, striped, flat, gloo)", s)
		}
	}
	if len(impls) == 0 || o.rounds < 1 {
		return fmt.Errorf("-impls and -rounds: nothing to measure")
	}
	if slices.Contains(impls, "gloo") {
		if _, err := os.Stat(o.gloo); err != nil {
			return fmt.Errorf("-gloo: %w (run from the repository root, or pass -gloo PATH)", err)
		}
	}
	np := H * L
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
			cancel() // the deferred Close removes the namespaces
		case <-ctx.Done():
		}
	}()
	names := make([]string, H)
	for i := range names {
		names[i] = fmt.Sprintf("h%d", i)
	}
	hnet, err := netns.New(ctx, names...)
	if err != nil {
		return err
	}
	defer hnet.Close()
	hosts := hnet.Hosts()
	if capBits > 0 {
		for _, h := range hosts {
			if err := h.Cap(ctx, capBits); err != nil {
				return err
			}
		}
	}
	hostOf := func(rank int) *netns.Host { return hosts[rank/L] }

	type key struct {
		impl string
		size int
	}
	medians := map[key][]float64{}
	ran := map[string]string{} // impl -> the Hierarchy the round reported
	var failed error
rounds:
	for round := 0; round < o.rounds; round++ {
		for _, im := range impls {
			var got map[int]float64
			var err error
			if im == "gloo" {
				got, err = measureGloo(ctx, o, np, hostOf)
			} else {
				var hier string
				got, hier, err = measureOurs(ctx, o, im, np, hostOf)
				ran[im] = hier
			}
			if err != nil {
				if ctx.Err() != nil {
					err = fmt.Errorf("%w (-timeout %v)", ctx.Err(), o.timeout)
				}
				failed = fmt.Errorf("round %d, %s: %w (the table has the rounds before it)", round+1, im, err)
				break rounds
			}
			for size, med := range got {
				medians[key{im, size}] = append(medians[key{im, size}], med)
			}
			fmt.Fprintf(os.Stderr, "[bench] round %d/%d: %s done\n", round+1, o.rounds, im)
		}
	}

	rate := float64(capBits) / 8 // bytes/s each way
	n := float64(np)
	if !o.json {
		fmt.Printf("# %d hosts x %d ranks (np=%d, ranks host-contiguous), links capped at %s each way (tc tbf), %d rounds; median over rounds of each run's median (slowest rank per iteration)\n",
			H, L, np, o.capArg, o.rounds)
		fmt.Printf("# bound: busbw <= B for the flat ring and Gloo's ring, B*H(N-1)/(N(H-1)) for the hierarchical allreduce (B = %.3f GB/s, the cap)\n", rate/1e9)
		fmt.Printf("%-8s %-8s %10s %12s %12s %12s %10s %8s %14s\n", "impl", "runs", "size(B)", "median(ms)", "algbw(GB/s)", "busbw(GB/s)", "bound", "%bound", "rounds' range")
	}
	for _, size := range o.sizes {
		for _, im := range impls {
			ms := medians[key{im, size}]
			if len(ms) == 0 {
				continue
			}
			slices.Sort(ms)
			med := ranks.Quantile(ms, 0.5)
			algbw := float64(size) / med
			busbw := algbw * 2 * (n - 1) / n
			bound := busBound(im, np, H, rate)
			runs := ran[im]
			if im == "gloo" {
				runs = "ring"
			}
			pct, lo, hi := 0.0, 0.0, 0.0
			if bound > 0 && capBits > 0 {
				pct = 100 * busbw / bound
				// ms is sorted: the slowest round has the lowest busbw.
				lo = 100 * float64(size) / ms[len(ms)-1] * 2 * (n - 1) / n / bound
				hi = 100 * float64(size) / ms[0] * 2 * (n - 1) / n / bound
			}
			if o.json {
				out, _ := json.Marshal(map[string]any{
					"impl": im, "runs": runs, "hosts": H, "per_host": L, "np": np, "size_bytes": size,
					"median_s": med, "algbw_GBps": algbw / 1e9, "busbw_GBps": busbw / 1e9,
					"bound_GBps": bound / 1e9, "pct_of_bound": pct, "cap_bits": capBits, "rounds": len(ms),
					"round_medians_s": ms,
				})
				fmt.Println(string(out))
			} else {
				fmt.Printf("%-8s %-8s %10d %12.2f %12.4f %12.4f %10.4f %7.1f%% %6.1f..%.1f%%\n", im, runs, size, med*1e3, algbw/1e9, busbw/1e9, bound/1e9, pct, lo, hi)
			}
		}
	}
	return failed
}

// measureOurs runs one group of this program's ranks, one per rank on its
// host, with Config.Hierarchy for im, and returns the median time per size
// and the hierarchy the round ran.
func measureOurs(ctx context.Context, o options, im string, np int, hostOf func(int) *netns.Host) (map[int]float64, string, error) {
	mode := im
	if im == "flat" {
		mode = "off"
	}
	extra := []string{"-np", strconv.Itoa(np), "-listen", "0.0.0.0:0", "-hierarchy", mode}
	g, err := ranks.StartWith(ctx, np, envPrefix, "bench-", extra, func(rank int) []string {
		return []string{"ip", "netns", "exec", hostOf(rank).Namespace()}
	})
	if err != nil {
		return nil, "", err
	}
	defer g.Kill()
	out := map[int]float64{}
	hier := ""
	for _, size := range o.sizes {
		reps, err := ranks.Reports(g, "size", size, func(r sizeResult) int { return r.Size })
		if err != nil {
			return nil, "", err
		}
		per := make([][]float64, np)
		for i, r := range reps {
			per[i] = r.Times
			hier = r.Hierarchy
		}
		out[size] = ranks.Quantile(ranks.Slowest(per), 0.5)
	}
	return out, hier, g.Wait()
}

// measureGloo runs one Gloo process group, rank r on its host, with the
// same plan as this program's ranks.
func measureGloo(ctx context.Context, o options, np int, hostOf func(int) *netns.Host) (map[int]float64, error) {
	var steps []string
	for _, size := range o.sizes {
		warm, iters := plan(o, size)
		steps = append(steps, fmt.Sprintf("%d:%d:%d", size, warm, iters))
	}
	master := hostOf(0).Addr(30000 + rand.IntN(20000))
	type proc struct {
		cmd *exec.Cmd
		sc  *bufio.Scanner
	}
	procs := make([]proc, np)
	defer func() {
		for _, p := range procs {
			if p.cmd != nil && p.cmd.Process != nil {
				p.cmd.Process.Kill()
				p.cmd.Wait()
			}
		}
	}()
	for r := range procs {
		cmd := hostOf(r).Command(ctx, o.python, o.gloo, "--rank", strconv.Itoa(r), "--world", strconv.Itoa(np),
			"--master", master, "--ifname", "eth0", "--plan", strings.Join(steps, ","))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		procs[r] = proc{cmd, sc}
	}
	res := map[int]float64{}
	for _, size := range o.sizes {
		per := make([][]float64, np)
		for r, p := range procs {
			if !p.sc.Scan() {
				return nil, fmt.Errorf("gloo rank %d stopped before reporting size %d", r, size)
			}
			var rep sizeResult
			if err := json.Unmarshal(p.sc.Bytes(), &rep); err != nil || rep.Size != size {
				return nil, fmt.Errorf("gloo rank %d: bad report for size %d: %q", r, size, p.sc.Text())
			}
			per[r] = rep.Times
		}
		res[size] = ranks.Quantile(ranks.Slowest(per), 0.5)
	}
	for r, p := range procs {
		err := p.cmd.Wait()
		procs[r].cmd = nil
		if err != nil {
			return nil, fmt.Errorf("gloo rank %d: %w", r, err)
		}
	}
	return res, nil
}
