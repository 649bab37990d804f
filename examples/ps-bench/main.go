// Command ps-bench measures the pull and push throughput of package sync's
// parameter server between np processes on this host (loopback).
//
// It re-executes itself np times (one process per rank). Every rank hosts
// one shard of one table (-rows rows of -dim float32, sparse Adagrad) and is
// also a worker: per iteration it pulls -batch distinct random rows (spread
// over every shard, so (np-1)/np of them cross a process boundary) and then
// pushes a gradient for each of them, in sync mode (a shard applies a step
// once every worker pushed, and the next pull waits for that). A pull's time
// therefore includes waiting for the previous step to be applied on every
// shard. An iteration's time is the maximum over ranks; per batch size it
// prints the median pull and push times and the aggregate rates over all
// ranks: rows/s and MB/s of row payload (dim*4 bytes per row; the 8-byte row
// IDs and the 48-byte frame headers are not counted).
//
//	go run ./examples/ps-bench -np 2
//	go run ./examples/ps-bench -np 4 -batch 1024,16384,65536 -json
//
// Each rank runs with GOMAXPROCS = max(1, NumCPU/np) unless -procs says
// otherwise.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/elastictrain/elastictrain/examples/internal/ranks"
	elsync "github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/paramserver"
)

// envPrefix names the environment variables that carry the job ID and
// secret to the ranks (package ranks).
const envPrefix = "PS_BENCH"

type options struct {
	np       int
	batches  []int
	batchArg string
	rows     int64
	dim      int
	iters    int
	warmup   int
	json     bool
	local    bool
	procs    int
	child    int
	cpuprof  string
	timeout  time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.np, "np", 2, "number of ranks (processes), each hosting one shard")
	flag.StringVar(&o.batchArg, "batch", "1024,16384,65536", "comma-separated rows per pull and push, per rank")
	flag.Int64Var(&o.rows, "rows", 1<<20, "rows of the table")
	flag.IntVar(&o.dim, "dim", 64, "float32 values per row")
	flag.IntVar(&o.iters, "iters", 0, "timed iterations per batch size (0: 50 for <=4096 rows, 20 <=65536, else 10)")
	flag.IntVar(&o.warmup, "warmup", 3, "warm-up iterations per batch size")
	flag.BoolVar(&o.json, "json", false, "print one JSON object per batch size")
	flag.BoolVar(&o.local, "local", elsync.DefaultConfig().LocalSockets, "use Unix domain sockets between ranks on this host (Config.LocalSockets)")
	flag.IntVar(&o.procs, "procs", -1, "GOMAXPROCS of each rank: -1 = max(1, NumCPU/np); 0 = Go's default")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "wall-clock cap for the whole run")
	flag.StringVar(&o.cpuprof, "cpuprofile", "", "write rank 0's CPU profile of the timed iterations to this file")
	flag.IntVar(&o.child, "child", -1, "internal: run as this rank")
	flag.Parse()
	var err error
	if o.batches, err = parseList(o.batchArg); err != nil {
		fail(2, err)
	}
	switch {
	case o.np < 1:
		fail(2, errors.New("-np must be at least 1"))
	case o.dim < 1 || o.rows < 1:
		fail(2, errors.New("-dim and -rows must be positive"))
	}
	for _, b := range o.batches {
		if int64(b) > o.rows {
			fail(2, fmt.Errorf("-batch %d exceeds -rows %d", b, o.rows))
		}
	}
	if o.procs < 0 {
		o.procs = ranks.DefaultProcs(o.np)
	}
	if o.child >= 0 {
		if err := runChild(o); err != nil {
			fmt.Fprintln(os.Stderr, "ps-bench rank", o.child, ":", err)
			os.Exit(1)
		}
		return
	}
	if err := runParent(o); err != nil {
		fail(1, err)
	}
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "ps-bench:", err)
	os.Exit(code)
}

func parseList(s string) ([]int, error) {
	return ranks.ParseList(s, "batch sizes", func(f string) (int, error) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("bad batch size %q", f)
		}
		return n, nil
	})
}

func plan(o options, batch int) (warm, iters int) {
	switch {
	case batch <= 4096:
		iters = 50
	case batch <= 65536:
		iters = 20
	default:
		iters = 10
	}
	if o.iters > 0 {
		iters = o.iters
	}
	return o.warmup, iters
}

// report is what a child prints per batch size.
type report struct {
	Batch int       `json:"batch"`
	Pull  []float64 `json:"pull"`
	Push  []float64 `json:"push"`
}

func runChild(o options) error {
	if o.procs > 0 {
		runtime.GOMAXPROCS(o.procs)
	}
	ctx := context.Background()
	cfg := elsync.DefaultConfig()
	cfg.JobID, cfg.Secret = ranks.JobEnv(envPrefix)
	cfg.LocalSockets = o.local
	cfg.OpTimeout = time.Minute
	tr, err := elsync.Listen(ctx, "127.0.0.1:0", cfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	table := paramserver.TableSpec{Name: "emb", Rows: o.rows, Dim: o.dim, Optimizer: paramserver.NewSparseAdagrad(0.01), InitScale: 0.01, Seed: 1}
	ps, err := paramserver.New(tr, []paramserver.TableSpec{table}, paramserver.DefaultConfig())
	if err != nil {
		return err
	}
	defer ps.Close()
	addrs, err := ranks.JoinWorld(tr.Addr())
	if err != nil {
		return err
	}
	r, err := ps.Round(ctx, paramserver.World{World: elsync.World{Round: 1, Rank: o.child, Addrs: addrs}}, 0)
	if err != nil {
		return err
	}
	defer r.Close()
	stopProfile := func() {}
	if o.child == 0 {
		if stopProfile, err = ranks.StartCPUProfile(o.cpuprof); err != nil {
			return err
		}
		defer stopProfile()
	}
	rng := mrand.New(mrand.NewPCG(uint64(o.child), 99))
	enc := json.NewEncoder(os.Stdout)
	for _, b := range o.batches {
		ids := make([]int64, b)
		vals := make([]float32, b*o.dim)
		grads := make([]float32, b*o.dim)
		for i := range grads {
			grads[i] = 1e-3
		}
		draw := func() {
			seen := make(map[int64]bool, b)
			for i := range ids {
				for {
					id := rng.Int64N(o.rows)
					if !seen[id] {
						seen[id], ids[i] = true, id
						break
					}
				}
			}
		}
		warm, iters := plan(o, b)
		rep := report{Batch: b}
		for i := 0; i < warm+iters; i++ {
			draw()
			t0 := time.Now()
			if err := r.Pull(ctx, paramserver.Rows{Table: 0, IDs: ids, Values: vals}); err != nil {
				return err
			}
			t1 := time.Now()
			if err := r.Push(ctx, paramserver.Rows{Table: 0, IDs: ids, Values: grads}); err != nil {
				return err
			}
			t2 := time.Now()
			if i >= warm {
				rep.Pull = append(rep.Pull, t1.Sub(t0).Seconds())
				rep.Push = append(rep.Push, t2.Sub(t1).Seconds())
			}
		}
		if err := enc.Encode(rep); err != nil {
			return err
		}
	}
	stopProfile()
	// Keep every shard up until every rank is done, then wait for the
	// parent's go-ahead.
	if err := r.Barrier(ctx); err != nil {
		return err
	}
	fmt.Println("DONE")
	_, err = bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && err != io.EOF {
		return err
	}
	return nil
}

// result is one JSON line of the parent.
type result struct {
	Impl          string  `json:"impl"`
	NP            int     `json:"np"`
	Dim           int     `json:"dim"`
	Rows          int64   `json:"table_rows"`
	Batch         int     `json:"batch_rows_per_rank"`
	Iters         int     `json:"iters"`
	PullMedianS   float64 `json:"pull_median_s"`
	PushMedianS   float64 `json:"push_median_s"`
	PullRowsPerS  float64 `json:"pull_rows_per_s"`
	PushRowsPerS  float64 `json:"push_rows_per_s"`
	PullMBPerS    float64 `json:"pull_MBps"`
	PushMBPerS    float64 `json:"push_MBps"`
	RemoteShare   float64 `json:"remote_share"`
	ProcsPerRank  int     `json:"gomaxprocs_per_rank"`
	LocalSockets  bool    `json:"local_sockets"`
	CoresOnHost   int     `json:"cores"`
	RowPayloadB   int     `json:"row_payload_bytes"`
	MedianIterS   float64 `json:"median_iteration_s"`
	StepsPerSec   float64 `json:"steps_per_s"`
	PullP90S      float64 `json:"pull_p90_s"`
	PushP90S      float64 `json:"push_p90_s"`
	TotalRowsStep int     `json:"rows_per_step"`
}

func runParent(o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	g, err := ranks.Start(ctx, o.np, envPrefix, "psbench-")
	if err != nil {
		return err
	}
	defer g.Kill()
	if !o.json {
		fmt.Printf("# elastictrain parameter server, np=%d (one shard each), table %d x %d float32, sparse Adagrad, sync mode, GOMAXPROCS per rank %d, %d cores, local sockets %v\n",
			o.np, o.rows, o.dim, o.procs, runtime.NumCPU(), o.local)
		fmt.Printf("%10s %6s %11s %13s %10s %11s %13s %10s\n", "rows/rank", "iters", "pull(ms)", "pull rows/s", "pull MB/s", "push(ms)", "push rows/s", "push MB/s")
	}
	n := float64(o.np)
	for _, b := range o.batches {
		reps, err := ranks.Reports(g, "batch", b, func(r report) int { return r.Batch })
		if err != nil {
			return err
		}
		var pulls, pushes, iters [][]float64
		for _, rep := range reps {
			iter := make([]float64, len(rep.Pull))
			for k := range iter {
				iter[k] = rep.Pull[k] + rep.Push[k]
			}
			pulls, pushes, iters = append(pulls, rep.Pull), append(pushes, rep.Push), append(iters, iter)
		}
		pull, push, iter := ranks.Slowest(pulls), ranks.Slowest(pushes), ranks.Slowest(iters)
		rows := n * float64(b)
		bytes := rows * float64(o.dim*4)
		res := result{Impl: "elastictrain-ps", NP: o.np, Dim: o.dim, Rows: o.rows, Batch: b, Iters: len(pull),
			PullMedianS: ranks.NearestRank(pull, 0.5), PushMedianS: ranks.NearestRank(push, 0.5), PullP90S: ranks.NearestRank(pull, 0.9), PushP90S: ranks.NearestRank(push, 0.9),
			RemoteShare: (n - 1) / n, ProcsPerRank: o.procs, LocalSockets: o.local, CoresOnHost: runtime.NumCPU(),
			RowPayloadB: o.dim * 4, MedianIterS: ranks.NearestRank(iter, 0.5), TotalRowsStep: int(rows)}
		res.PullRowsPerS, res.PushRowsPerS = rows/res.PullMedianS, rows/res.PushMedianS
		res.PullMBPerS, res.PushMBPerS = bytes/res.PullMedianS/1e6, bytes/res.PushMedianS/1e6
		res.StepsPerSec = 1 / res.MedianIterS
		if o.json {
			j, _ := json.Marshal(res)
			fmt.Println(string(j))
		} else {
			fmt.Printf("%10d %6d %11.3f %13.0f %10.1f %11.3f %13.0f %10.1f\n", b, res.Iters,
				res.PullMedianS*1e3, res.PullRowsPerS, res.PullMBPerS, res.PushMedianS*1e3, res.PushRowsPerS, res.PushMBPerS)
		}
	}
	for i := range o.np {
		if line, ok := g.Line(i); !ok || line != "DONE" {
			return fmt.Errorf("rank %d did not finish", i)
		}
	}
	g.Send("EXIT")
	return g.Wait()
}
