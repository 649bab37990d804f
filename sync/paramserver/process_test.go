package paramserver_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	elsync "github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"
)

const psHelperEnv = "ELASTICTRAIN_PS_HELPER"

// psStepPushes is rank's push of step: the same in every process.
func psStepPushes(specs []paramserver.TableSpec, rank, step int) []paramserver.Rows {
	rng := mrand.New(mrand.NewPCG(uint64(rank)+1000, uint64(step)))
	var bs []paramserver.Rows
	for tb := range specs {
		bs = append(bs, randomBatch(rng, specs, tb, 25))
	}
	return bs
}

// TestPSHelperProcess is a parameter-server rank in a child process (re-exec
// of the test binary), inert unless ELASTICTRAIN_PS_HELPER is set. On
// stdout: "ADDR <addr>"; after "WORLD <addrs>" on stdin it trains two sync
// steps, commits step 2 to the directory store, prints "COMMITTED", and
// keeps training until an error or 60 s.
func TestPSHelperProcess(t *testing.T) {
	if os.Getenv(psHelperEnv) == "" {
		return
	}
	os.Exit(psHelperMain())
}

func psHelperMain() int {
	cfg := elsync.DefaultConfig()
	cfg.JobID = os.Getenv("PS_HELPER_JOB")
	cfg.Secret, _ = hex.DecodeString(os.Getenv("PS_HELPER_SECRET"))
	cfg.DialTimeout, cfg.OpTimeout = 20*time.Second, 20*time.Second
	rank, _ := strconv.Atoi(os.Getenv("PS_HELPER_RANK"))
	ctx := context.Background()
	tr, err := elsync.Listen(ctx, "127.0.0.1:0", cfg)
	if err != nil {
		fmt.Println("FATAL", err)
		return 1
	}
	defer tr.Close()
	pcfg := paramserver.DefaultConfig()
	if dir := os.Getenv("PS_HELPER_STORE"); dir != "" {
		store, err := paramserver.NewDirShardStore(dir, 0)
		if err != nil {
			fmt.Println("FATAL", err)
			return 1
		}
		pcfg.Store, pcfg.Replicas = store, 0
	}
	specs := paramserver.PSTables()
	ps, err := paramserver.New(tr, specs, pcfg)
	if err != nil {
		fmt.Println("FATAL", err)
		return 1
	}
	defer ps.Close()
	fmt.Println("ADDR", tr.Addr())
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "WORLD ") {
		fmt.Println("FATAL bad world line", err)
		return 1
	}
	addrs := strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "WORLD ")), ",")
	r, err := ps.Round(ctx, paramserver.World{World: elsync.World{Round: 1, Rank: rank, Addrs: addrs}}, 0)
	if err != nil {
		fmt.Println("FATAL", err)
		return 1
	}
	defer r.Close()
	stop := time.Now().Add(60 * time.Second)
	for step := 0; time.Now().Before(stop); step++ {
		if step == 2 {
			if err := r.Commit(ctx, 2); err != nil {
				fmt.Println("FATAL", err)
				return 1
			}
			fmt.Println("COMMITTED")
		}
		pull := psStepPushes(specs, rank+50, step)
		if err := r.Pull(ctx, pull...); err != nil {
			fmt.Println("ERR", err)
			return 0
		}
		if err := r.Push(ctx, psStepPushes(specs, rank, step)...); err != nil {
			fmt.Println("ERR", err)
			return 0
		}
	}
	return 0
}

// TestPSKilledHostProcess: rank 2 of a 3-rank parameter server is a child
// process hosting a shard. After a commit at step 2 it is SIGKILLed while
// everyone trains: both survivors' calls fail with a *PeerError naming rank
// 2 within 2 s. The survivors then form round 2 from step 2: the dead
// rank's rows come back, with their optimizer state, from the directory
// store (no replicas) or from rank 0's memory (its replica, no store), and
// every row is exactly as the reference had it at step 2.
func TestPSKilledHostProcess(t *testing.T) {
	for _, viaStore := range []bool{true, false} {
		t.Run(fmt.Sprintf("store=%v", viaStore), func(t *testing.T) { killedHostProcess(t, viaStore) })
	}
}

func killedHostProcess(t *testing.T, viaStore bool) {
	specs := paramserver.PSTables()
	cfg := psTestConfig(t)
	pcfg := paramserver.DefaultConfig()
	dir := ""
	if viaStore {
		dir = t.TempDir()
		store, err := paramserver.NewDirShardStore(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.Store, pcfg.Replicas = store, 0
	}
	nodes := newPSNodes(t, 2, cfg, specs, pcfg)

	cmd := exec.Command(os.Args[0], "-test.run=^TestPSHelperProcess$", "-test.v=false")
	cmd.Env = append(os.Environ(), psHelperEnv+"=1", "PS_HELPER_JOB="+cfg.JobID, "PS_HELPER_SECRET="+hex.EncodeToString(cfg.Secret),
		"PS_HELPER_RANK=2", "PS_HELPER_STORE="+dir)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(want string) string {
		select {
		case l := <-lines:
			if !strings.HasPrefix(l, want) {
				t.Fatalf("child said %q, want %s", l, want)
			}
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("child did not say %s", want)
		}
		return ""
	}
	addrs := []string{nodes[0].tr.Addr(), nodes[1].tr.Addr(), strings.TrimPrefix(next("ADDR "), "ADDR ")}
	fmt.Fprintf(stdin, "WORLD %s\n", strings.Join(addrs, ","))

	ref := newPSRef(specs)
	for step := 0; step < 2; step++ {
		ref.step([][]paramserver.Rows{psStepPushes(specs, 0, step), psStepPushes(specs, 1, step), psStepPushes(specs, 2, step)})
	}
	rs := make([]*paramserver.Round, 2)
	errs := make([]error, 2)
	failedAt := make([]time.Time, 2)
	committed := make(chan struct{}, 2)
	var wg gosync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			r, err := nodes[i].ps.Round(ctx, paramserver.World{World: elsync.World{Round: 1, Rank: i, Addrs: addrs}}, 0)
			if err != nil {
				errs[i] = err
				committed <- struct{}{}
				return
			}
			rs[i] = r
			for step := 0; ; step++ {
				if step == 2 {
					if err := r.Commit(ctx, 2); err != nil {
						errs[i] = err
						committed <- struct{}{}
						return
					}
					committed <- struct{}{}
				}
				if err := r.Pull(ctx, psStepPushes(specs, i+50, step)...); err != nil {
					errs[i], failedAt[i] = err, time.Now()
					return
				}
				if err := r.Push(ctx, psStepPushes(specs, i, step)...); err != nil {
					errs[i], failedAt[i] = err, time.Now()
					return
				}
			}
		}()
	}
	<-committed
	<-committed
	next("COMMITTED")
	killedAt := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		var pe *elsync.PeerError
		if !errors.As(err, &pe) || pe.Rank != 2 {
			t.Fatalf("rank %d: got %v, want a *elsync.PeerError naming rank 2", i, err)
		}
		if d := failedAt[i].Sub(killedAt); d > 2*time.Second {
			t.Fatalf("rank %d noticed the kill after %v", i, d)
		}
		t.Logf("rank %d: %v after %v", i, err, failedAt[i].Sub(killedAt).Round(time.Millisecond))
		rs[i].Close()
	}

	r2 := mustPSRounds(t, nodes, 2, paramserver.World{}, 2)
	var fromStore int64
	for _, r := range r2 {
		fromStore += r.Stats().RestoredFromStore
	}
	if viaStore != (fromStore > 0) {
		t.Fatalf("%d rows restored from the store", fromStore)
	}
	got := dumpShards(t, specs, r2)
	for tb := range specs {
		d, sd := int64(specs[tb].Dim), int64(specs[tb].Optimizer.StateDim(specs[tb].Dim))
		for row := int64(0); row < specs[tb].Rows; row++ {
			want := psRow{val: ref.val[tb][row*d : (row+1)*d], st: ref.st[tb][row*sd : (row+1)*sd]}
			if fmt.Sprint(got[tb][row]) != fmt.Sprint(want) {
				t.Fatalf("table %d row %d: got %v, want %v", tb, row, got[tb][row], want)
			}
		}
	}
}
