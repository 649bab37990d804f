// Command allreduce-bench measures package sync's allreduce between np
// processes on this host (loopback), in the manner of NCCL-tests and of
// gloo_allreduce.py beside it (PyTorch's Gloo), so both can run side by
// side (compare.sh).
//
// It re-executes itself np times (one process per rank), forms one round,
// and per size runs warm-up iterations, a barrier, then timed back-to-back
// AllReduceFloat32 (OpSum) calls on a zeroed buffer. An iteration's time is
// the maximum over ranks (the slowest rank counts); per size it prints the
// median time, algbw = size/median and busbw = algbw * 2(n-1)/n.
//
//	go run ./examples/allreduce-bench -np 2 -sizes 4K,1M,64M
//	go run ./examples/allreduce-bench -np 4 -json
//
// Each rank runs with GOMAXPROCS = max(1, NumCPU/np) unless -procs says
// otherwise: several ranks on one host should not each spin up a thread per
// core (torchrun likewise sets OMP_NUM_THREADS=1 per rank); -procs 0 keeps
// Go's default.
//
// With -json it prints one JSON object per size with the fields of the Gloo
// script: impl, np, size_bytes, median_s, algbw_GBps, busbw_GBps (plus
// iters, p10_s, p90_s and the settings).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/elastictrain/elastictrain/examples/internal/ranks"
	elsync "github.com/elastictrain/elastictrain/sync"
)

// envPrefix names the environment variables that carry the job ID and
// secret to the ranks (package ranks).
const envPrefix = "ALLREDUCE_BENCH"

type options struct {
	np       int
	sizes    []int
	iters    int
	warmup   int
	json     bool
	streams  int
	chunk    int
	direct   int
	local    bool
	shm      bool
	timeout  time.Duration
	child    int
	sizesArg string
	cpuprof  string
	procs    int
	// between hosts (hosts.go)
	listen    string
	hierarchy string
	hostsArg  string
	capArg    string
	impls     string
	rounds    int
	gloo      string
	python    string
}

func main() {
	var o options
	flag.IntVar(&o.np, "np", 2, "number of ranks (processes)")
	flag.StringVar(&o.sizesArg, "sizes", "4K,64K,1M,16M,64M", "comma-separated buffer sizes in bytes; suffixes K, M, G (powers of 1024)")
	flag.IntVar(&o.iters, "iters", 0, "timed iterations per size (0: 500 for <=4K, 300 <=64K, 100 <=1M, 20 <=16M, else 10)")
	flag.IntVar(&o.warmup, "warmup", -1, "warm-up iterations per size (-1: 20 for <=64K, 10 <=1M, 3 <=16M, else 2)")
	flag.BoolVar(&o.json, "json", false, "print one JSON object per size")
	def := elsync.DefaultConfig()
	flag.IntVar(&o.streams, "streams", def.Streams, "parallel connections per ring link (Config.Streams)")
	flag.IntVar(&o.chunk, "chunk", def.ChunkBytes, "pipelining chunk in bytes (Config.ChunkBytes)")
	flag.IntVar(&o.direct, "direct", def.DirectBytes, "largest buffer in bytes for the direct (latency) path (Config.DirectBytes)")
	flag.BoolVar(&o.local, "local", def.LocalSockets, "use Unix domain sockets between ranks on this host (Config.LocalSockets)")
	flag.BoolVar(&o.shm, "shm", def.SharedMemory, "carry ring payloads between ranks on this host through shared memory (Config.SharedMemory)")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "wall-clock cap for the whole run (with -hosts: default 2h)")
	flag.IntVar(&o.procs, "procs", -1, "GOMAXPROCS of each rank: -1 = max(1, NumCPU/np), the usual setting for several ranks per host (as torchrun sets OMP_NUM_THREADS=1); 0 = Go's default (NumCPU)")
	flag.IntVar(&o.child, "child", -1, "internal: run as this rank")
	flag.StringVar(&o.cpuprof, "cpuprofile", "", "write rank 0's CPU profile of the timed iterations to this file")
	flag.StringVar(&o.listen, "listen", "127.0.0.1:0", "address each rank listens on (with -hosts: 0.0.0.0:0, each rank on its host's address)")
	flag.StringVar(&o.hierarchy, "hierarchy", "auto", "allreduce for ranks sharing hosts (Config.Hierarchy): auto, off (flat ring), leaders, striped")
	flag.StringVar(&o.hostsArg, "hosts", "", "run between hosts made of network namespaces (root, Linux): HxL = H hosts of L ranks each (np = H*L), e.g. 2x2; several comma-separated layouts run one after another")
	flag.StringVar(&o.capArg, "cap", "1gbit", "with -hosts: cap each host's link to this rate each way (tc tbf; suffixes kbit, mbit, gbit; 0 = none)")
	flag.StringVar(&o.impls, "impls", "leaders,striped,flat,gloo", "with -hosts: what to measure, in this order each round: leaders, striped, flat (this package with Config.Hierarchy), gloo (PyTorch)")
	flag.IntVar(&o.rounds, "rounds", 3, "with -hosts: rounds; each measures every -impls entry once, and the table shows the median over rounds")
	flag.StringVar(&o.gloo, "gloo", "examples/allreduce-bench/gloo_rank.py", "with -hosts: the Gloo rank script")
	flag.StringVar(&o.python, "python", "/usr/bin/python3", "with -hosts: the Python with torch (Debian's python3-torch)")
	flag.Parse()
	sizes, err := parseSizes(o.sizesArg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "allreduce-bench:", err)
		os.Exit(2)
	}
	if hierarchyOf(o.hierarchy) > elsync.HierarchyStriped {
		fmt.Fprintf(os.Stderr, "allreduce-bench: -hierarchy %q: want auto, off, leaders or striped\n", o.hierarchy)
		os.Exit(2)
	}
	o.sizes = sizes
	if o.procs < 0 {
		o.procs = ranks.DefaultProcs(o.np)
	}
	if o.np < 1 {
		fmt.Fprintln(os.Stderr, "allreduce-bench: -np must be at least 1")
		os.Exit(2)
	}
	if o.hostsArg != "" && o.child < 0 {
		set := false
		flag.Visit(func(f *flag.Flag) { set = set || f.Name == "timeout" })
		if !set {
			o.timeout = 2 * time.Hour // rounds of every implementation at 1 Gbit/s take a while
		}
		if err := runHosts(o); err != nil {
			fmt.Fprintln(os.Stderr, "allreduce-bench:", err)
			os.Exit(1)
		}
		return
	}
	if o.child >= 0 {
		if err := runChild(o); err != nil {
			fmt.Fprintln(os.Stderr, "allreduce-bench rank", o.child, ":", err)
			os.Exit(1)
		}
		return
	}
	if err := runParent(o); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce-bench:", err)
		os.Exit(1)
	}
}

// parseSizes parses "4K,1M,4096" into bytes; each must be a positive
// multiple of 4 (float32 elements).
func parseSizes(s string) ([]int, error) {
	return ranks.ParseList(s, "sizes", func(f string) (int, error) {
		f = strings.ToUpper(f)
		mult := 1
		for _, suf := range []struct {
			s string
			m int
		}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
			if strings.HasSuffix(f, suf.s) {
				f, mult = strings.TrimSuffix(f, suf.s), suf.m
				break
			}
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("bad size %q", f)
		}
		n *= mult
		if n%4 != 0 {
			return 0, fmt.Errorf("size %d is not a multiple of 4 bytes (float32)", n)
		}
		return n, nil
	})
}

func plan(o options, size int) (warm, iters int) {
	switch {
	case size <= 4<<10:
		warm, iters = 20, 500
	case size <= 64<<10:
		warm, iters = 20, 300
	case size <= 1<<20:
		warm, iters = 10, 100
	case size <= 16<<20:
		warm, iters = 3, 20
	default:
		warm, iters = 2, 10
	}
	if o.iters > 0 {
		iters = o.iters
	}
	if o.warmup >= 0 {
		warm = o.warmup
	}
	return warm, iters
}

// sizeResult is what a child reports per size: its per-iteration times.
type sizeResult struct {
	Size  int       `json:"size"`
	Times []float64 `json:"times"`
	// Hierarchy is the allreduce the round ran for large buffers (off =
	// the flat ring).
	Hierarchy string `json:"hierarchy"`
}

func config(o options) elsync.Config {
	cfg := elsync.DefaultConfig()
	cfg.JobID, cfg.Secret = ranks.JobEnv(envPrefix)
	cfg.Streams = o.streams
	cfg.ChunkBytes = o.chunk
	cfg.DirectBytes = o.direct
	cfg.MaxFrameBytes = max(cfg.MaxFrameBytes, o.chunk, o.direct)
	cfg.LocalSockets = o.local
	cfg.SharedMemory = o.shm
	cfg.OpTimeout = 60 * time.Second
	cfg.Hierarchy = hierarchyOf(o.hierarchy)
	return cfg
}

func runChild(o options) error {
	if o.procs > 0 {
		runtime.GOMAXPROCS(o.procs)
	}
	ctx := context.Background()
	tr, err := elsync.Listen(ctx, o.listen, config(o))
	if err != nil {
		return err
	}
	defer tr.Close()
	addrs, err := ranks.JoinWorld(tr.Addr())
	if err != nil {
		return err
	}
	ring, err := tr.Connect(ctx, elsync.World{Round: 1, Rank: o.child, Addrs: addrs})
	if err != nil {
		return err
	}
	defer ring.Close()
	if o.child == 0 {
		stop, err := ranks.StartCPUProfile(o.cpuprof)
		if err != nil {
			return err
		}
		defer stop()
	}
	enc := json.NewEncoder(os.Stdout)
	for _, size := range o.sizes {
		buf := make([]float32, size/4) // zeros: sums never overflow
		warm, iters := plan(o, size)
		for i := 0; i < warm; i++ {
			if err := ring.AllReduceFloat32(ctx, buf, elsync.OpSum); err != nil {
				return err
			}
		}
		if err := ring.Barrier(ctx); err != nil {
			return err
		}
		times := make([]float64, iters)
		for i := range times {
			t0 := time.Now()
			if err := ring.AllReduceFloat32(ctx, buf, elsync.OpSum); err != nil {
				return err
			}
			times[i] = time.Since(t0).Seconds()
		}
		if err := enc.Encode(sizeResult{Size: size, Times: times, Hierarchy: ring.Hierarchy().String()}); err != nil {
			return err
		}
	}
	return ring.Barrier(ctx)
}

func runParent(o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	g, err := ranks.Start(ctx, o.np, envPrefix, "bench-")
	if err != nil {
		return err
	}
	defer g.Kill()
	if !o.json {
		fmt.Printf("# elastictrain sync allreduce, np=%d, streams=%d, chunk=%d, direct=%d, local sockets=%v, shared memory=%v, GOMAXPROCS per rank=%d (0: Go default)\n", o.np, o.streams, o.chunk, o.direct, o.local, o.shm, o.procs)
		fmt.Printf("%12s %8s %12s %12s %12s\n", "size(B)", "iters", "median(us)", "algbw(GB/s)", "busbw(GB/s)")
	}
	n := float64(o.np)
	for _, size := range o.sizes {
		reps, err := ranks.Reports(g, "size", size, func(r sizeResult) int { return r.Size })
		if err != nil {
			return err
		}
		per := make([][]float64, o.np)
		for i, r := range reps {
			per[i] = r.Times
		}
		t := ranks.Slowest(per)
		iters := len(t)
		med := ranks.Quantile(t, 0.5)
		algbw := float64(size) / med / 1e9
		busbw := algbw * 2 * (n - 1) / n
		if o.np == 1 {
			busbw = 0
		}
		if o.json {
			out, _ := json.Marshal(map[string]any{
				"impl": "elastictrain", "np": o.np, "size_bytes": size, "median_s": med,
				"algbw_GBps": algbw, "busbw_GBps": busbw, "iters": iters,
				"p10_s": ranks.Quantile(t, 0.1), "p90_s": ranks.Quantile(t, 0.9),
				"streams": o.streams, "chunk_bytes": o.chunk, "direct_bytes": o.direct, "local_sockets": o.local, "shared_memory": o.shm, "gomaxprocs": o.procs,
			})
			fmt.Println(string(out))
		} else {
			fmt.Printf("%12d %8d %12.1f %12.3f %12.3f\n", size, iters, med*1e6, algbw, busbw)
		}
	}
	return g.Wait()
}
