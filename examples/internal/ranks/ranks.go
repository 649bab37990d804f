// Package ranks runs the processes of a single-host benchmark
// (allreduce-bench, ps-bench), one process per rank, and summarises their
// timings. The processes are one launch.Job: launch starts, places,
// signals and reaps them; this package adds the benchmarks' exchange of
// addresses and their report lines.
//
// # Protocol
//
// The parent re-executes its own binary once per rank with its own
// arguments followed by "-child RANK", and with a job ID and a random
// 32-byte secret (hex) in the environment variables PREFIX_JOB and
// PREFIX_SECRET. Each child listens on loopback, prints "ADDR host:port" on
// stdout and reads "WORLD addr0,addr1,..." (every rank's address, by rank)
// from stdin (JoinWorld). Afterwards a child reports on stdout, one line
// per measurement, which the parent reads with Group.Line or Reports.
package ranks

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"github.com/elastictrain/elastictrain/launch"
)

// Group is the parent's handle on the child processes, one per rank. Not
// safe for concurrent use.
type Group struct {
	job   *launch.Job
	ranks []*rank
}

type rank struct {
	stdin  io.WriteCloser // the parent's end of the child's stdin
	out    *bufio.Scanner // the child's stdout
	stdout *os.File       // the parent's end of it
	// The child's ends, closed by the parent once it started.
	childIn, childOut *os.File
}

// Start starts np children of this binary, this process' arguments
// followed by "-child RANK", with stderr shared with this process, and
// gives them the environment entries envPrefix+"_JOB" = jobPrefix + 16
// random hex digits and envPrefix+"_SECRET" = a random 32-byte secret in
// hex (read them back with JobEnv), then reads every child's "ADDR" line
// and sends all of them the "WORLD" line. ctx bounds the children's lives
// (launch stops them with a SIGTERM when it is done). On error the
// children already started are killed.
func Start(ctx context.Context, np int, envPrefix, jobPrefix string) (*Group, error) {
	return StartWith(ctx, np, envPrefix, jobPrefix, nil, nil)
}

// StartWith is Start with extra arguments after this process' own (later
// flags win) and with wrap, when not nil, giving each rank's command prefix
// (launch.Spec.Wrap: for example `ip netns exec NS` to start it in a
// network namespace of its own).
func StartWith(ctx context.Context, np int, envPrefix, jobPrefix string, extra []string, wrap func(rank int) []string) (*Group, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	secret, job := make([]byte, 32), make([]byte, 8)
	rand.Read(secret)
	rand.Read(job)
	g := &Group{ranks: make([]*rank, np)}
	closeAll := func() {
		for _, r := range g.ranks {
			if r != nil {
				r.stdin.Close()
				r.stdout.Close()
				r.childIn.Close()
				r.childOut.Close()
			}
		}
	}
	for i := range g.ranks {
		r := &rank{}
		var err error
		var in *os.File
		if r.childIn, in, err = os.Pipe(); err == nil {
			r.stdin = in
			r.stdout, r.childOut, err = os.Pipe()
		}
		if err != nil {
			if in != nil {
				in.Close()
				r.childIn.Close()
			}
			closeAll()
			return nil, err
		}
		r.out = bufio.NewScanner(r.stdout)
		r.out.Buffer(make([]byte, 1<<20), 64<<20)
		g.ranks[i] = r
	}
	cfg := launch.DefaultConfig()
	cfg.Workers, cfg.MaxRestarts = np, 0
	// The children pick their own GOMAXPROCS (-procs), talk to no store,
	// and a rank that finished waits for nothing: the others end at the
	// same time, or ctx ends them.
	cfg.GOMAXPROCS, cfg.NoStore, cfg.StoreListen, cfg.GracePeriod = -1, true, "", time.Minute
	spec := launch.Spec{
		Command: append(append([]string{exe}, os.Args[1:]...), extra...),
		Env:     []string{envPrefix + "_JOB=" + jobPrefix + hex.EncodeToString(job), envPrefix + "_SECRET=" + hex.EncodeToString(secret)},
		Stderr:  os.Stderr,
		Wrap:    wrap,
	}
	hooks := launch.Hooks{
		Prepare: func(p launch.Process, cmd *exec.Cmd) error {
			r := g.ranks[p.Worker]
			cmd.Args = append(cmd.Args, "-child", strconv.Itoa(p.Worker))
			cmd.Stdin, cmd.Stdout = r.childIn, r.childOut
			return nil
		},
		OnStart: func(p launch.Process) {
			r := g.ranks[p.Worker]
			r.childIn.Close() // the child holds them now
			r.childOut.Close()
		},
	}
	g.job, err = launch.Start(ctx, spec, cfg, launch.WithHooks(hooks))
	if err != nil {
		closeAll()
		return nil, err
	}
	if err := g.exchange(); err != nil {
		g.Kill()
		return nil, err
	}
	return g, nil
}

// exchange reads every child's "ADDR" line and sends all of them the
// "WORLD" line. It is an error when a child stops or prints anything else
// first.
func (g *Group) exchange() error {
	addrs := make([]string, len(g.ranks))
	for i := range g.ranks {
		line, ok := g.Line(i)
		if !ok || !strings.HasPrefix(line, "ADDR ") {
			return fmt.Errorf("rank %d did not report its address", i)
		}
		addrs[i] = strings.TrimPrefix(line, "ADDR ")
	}
	g.Send("WORLD " + strings.Join(addrs, ","))
	return nil
}

// Line returns the next stdout line of rank i (at most 64 MiB), and false
// when the child closed its stdout or the line could not be read.
func (g *Group) Line(i int) (string, bool) {
	r := g.ranks[i]
	if !r.out.Scan() {
		return "", false
	}
	return r.out.Text(), true
}

// Reports reads the next stdout line of every rank as a JSON T, by rank.
// key is the measurement the lines must be about, as keyOf reads it from
// a T, and what names it in the errors "rank I stopped before reporting
// WHAT KEY" and "rank I: bad report for WHAT KEY: LINE".
func Reports[T any](g *Group, what string, key int, keyOf func(T) int) ([]T, error) {
	out := make([]T, len(g.ranks))
	for i := range out {
		line, ok := g.Line(i)
		if !ok {
			return nil, fmt.Errorf("rank %d stopped before reporting %s %d", i, what, key)
		}
		if err := json.Unmarshal([]byte(line), &out[i]); err != nil || keyOf(out[i]) != key {
			return nil, fmt.Errorf("rank %d: bad report for %s %d: %q", i, what, key, line)
		}
	}
	return out, nil
}

// Send writes line and a newline to every child's stdin.
func (g *Group) Send(line string) {
	for _, r := range g.ranks {
		fmt.Fprintln(r.stdin, line)
	}
}

// Wait closes every child's stdin and waits for each to exit; it returns
// the first failure by rank as "rank I: ...".
func (g *Group) Wait() error {
	for _, r := range g.ranks {
		r.stdin.Close()
	}
	res, _ := g.job.Wait()
	g.closeOutputs()
	for _, x := range res.Last() {
		if x.Outcome != launch.Finished {
			err := x.Err
			if err == nil {
				err = fmt.Errorf("exit status %d", x.Code)
			}
			return fmt.Errorf("rank %d: %w", x.Worker, err)
		}
	}
	return nil
}

// Kill kills the children that have not exited and waits for them; defer
// it right after Start (after Wait it does nothing more).
func (g *Group) Kill() {
	for _, r := range g.ranks {
		r.stdin.Close()
	}
	g.job.Kill()
	g.job.Wait()
	g.closeOutputs()
}

func (g *Group) closeOutputs() {
	for _, r := range g.ranks {
		r.stdout.Close()
	}
}

// JobEnv returns the job ID and secret Start gave this child under
// envPrefix; a missing or malformed secret comes back empty (the transport
// then refuses to form a world with a peer that has another).
func JobEnv(envPrefix string) (job string, secret []byte) {
	secret, _ = hex.DecodeString(os.Getenv(envPrefix + "_SECRET"))
	return os.Getenv(envPrefix + "_JOB"), secret
}

// JoinWorld is the child's side of Exchange: it prints "ADDR addr" on
// stdout and returns the addresses of the "WORLD" line read from stdin,
// by rank.
func JoinWorld(addr string) ([]string, error) {
	fmt.Println("ADDR", addr)
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("reading the world: %w", err)
	}
	return strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "WORLD ")), ","), nil
}

// StartCPUProfile writes a CPU profile to path until the returned stop is
// called (stop may be called more than once); with path empty it does
// nothing.
func StartCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var once gosync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}, nil
}

// DefaultProcs is the GOMAXPROCS of each of np ranks on this host,
// max(1, NumCPU/np): several ranks on one host should not each spin up a
// thread per core (torchrun likewise sets OMP_NUM_THREADS=1 per rank).
func DefaultProcs(np int) int {
	return max(1, runtime.NumCPU()/max(1, np))
}

// ParseList parses a comma-separated list (blanks around entries and empty
// entries are ignored) with parse; what names the entries in the error of
// an empty list ("no " + what).
func ParseList(s, what string, parse func(string) (int, error)) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := parse(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no " + what)
	}
	return out, nil
}

// Slowest returns, sorted ascending, each iteration's time as the maximum
// over ranks (the slowest rank counts): per[rank][iteration], in seconds;
// every rank must report the same number of iterations.
func Slowest(per [][]float64) []float64 {
	if len(per) == 0 {
		return nil
	}
	t := make([]float64, len(per[0]))
	for k := range t {
		for i := range per {
			t[k] = max(t[k], per[i][k])
		}
	}
	slices.Sort(t)
	return t
}

// Quantile returns the q-quantile (0 <= q <= 1) of sorted values with
// linear interpolation between neighbours (type 7 of Hyndman and Fan,
// 1996, as numpy's default); 0 for no values.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := q * float64(len(sorted)-1)
	lo := int(pos)
	if lo+1 >= len(sorted) {
		return sorted[lo]
	}
	return sorted[lo] + (pos-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// NearestRank returns the q-quantile (0 <= q <= 1) of sorted values as the
// value at the rounded position q*(n-1), without interpolation; 0 for no
// values.
func NearestRank(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)-1) + 0.5)
	return sorted[min(max(i, 0), len(sorted)-1)]
}
