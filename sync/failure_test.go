package sync

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHelperProcess is a child rank of the failure tests (re-exec of the
// test binary). It is inert unless ELASTICTRAIN_SYNC_HELPER is set.
// Protocol on stdout: "ADDR <addr>", then (after "WORLD <addrs>" on stdin)
// "RUNNING" after the first allreduce (AllReduceFloat32, or with
// SYNC_HELPER_OP=ordered AllReduceOrderedFloat32), and "ERR <seconds> peer=<rank>
// timeout=<bool> lost=<bool> <message>" when an allreduce fails, then exit.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		return
	}
	os.Exit(helperMain())
}

func helperMain() int {
	env := func(k string) int {
		v, _ := strconv.Atoi(os.Getenv(k))
		return v
	}
	cfg := DefaultConfig()
	cfg.JobID = os.Getenv("SYNC_HELPER_JOB")
	cfg.Secret, _ = hex.DecodeString(os.Getenv("SYNC_HELPER_SECRET"))
	cfg.OpTimeout = time.Duration(env("SYNC_HELPER_OPTIMEOUT_MS")) * time.Millisecond
	cfg.DialTimeout = 20 * time.Second
	cfg.LocalSockets = os.Getenv("SYNC_HELPER_TCP") == ""
	rank, elems := env("SYNC_HELPER_RANK"), env("SYNC_HELPER_ELEMS")
	ctx := context.Background()
	tr, err := Listen(ctx, "127.0.0.1:0", cfg)
	if err != nil {
		fmt.Println("FATAL", err)
		return 1
	}
	defer tr.Close()
	fmt.Println("ADDR", tr.Addr())
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "WORLD ") {
		fmt.Println("FATAL bad world line", err)
		return 1
	}
	addrs := strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "WORLD ")), ",")
	ring, err := tr.Connect(ctx, World{Round: 1, Rank: rank, Addrs: addrs})
	if err != nil {
		fmt.Println("FATAL", err)
		return 1
	}
	defer ring.Close()
	buf := make([]float32, elems)
	op := func() error { return ring.AllReduceFloat32(ctx, buf, OpSum) }
	switch os.Getenv("SYNC_HELPER_OP") {
	case "ordered":
		parts := [][]float32{make([]float32, elems), make([]float32, elems)}
		op = func() error { return ring.AllReduceOrderedFloat32(ctx, parts, buf) }
	case "ordered-tensors":
		// The last part as three tensors, the sum written into them.
		tensors := [][]float32{buf[:elems/3], buf[elems/3 : elems/2], buf[elems/2:]}
		op = func() error { return ring.AllReduceOrderedTensors(ctx, nil, tensors) }
	}
	stopAt := time.Now().Add(60 * time.Second) // bounded: stops by itself
	for i := 0; time.Now().Before(stopAt); i++ {
		start := time.Now()
		err := op()
		if err != nil {
			peer := -1
			var pe *PeerError
			if errors.As(err, &pe) {
				peer = pe.Rank
			}
			fmt.Printf("ERR %.3f peer=%d timeout=%v lost=%v %v\n", time.Since(start).Seconds(), peer,
				errors.Is(err, ErrTimeout), errors.Is(err, ErrPeerLost), err)
			return 0
		}
		if i == 0 {
			fmt.Println("RUNNING")
		}
	}
	fmt.Println("DONE")
	return 0
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// startRanks starts n child ranks and forms their world; it returns once
// every child has completed one allreduce.
func startRanks(t *testing.T, n, elems int, opTimeout time.Duration, tcp bool) []*child {
	t.Helper()
	return startRanksOp(t, n, elems, opTimeout, tcp, "")
}

// startRanksOp is startRanks with the children running op: "" for
// AllReduceFloat32, "ordered" for AllReduceOrderedFloat32 (two parts each),
// "ordered-tensors" for AllReduceOrderedTensors (no part but the tensors).
func startRanksOp(t *testing.T, n, elems int, opTimeout time.Duration, tcp bool, op string) []*child {
	t.Helper()
	cfg := testConfig(t)
	kids := make([]*child, n)
	for r := range kids {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), helperEnv+"=1",
			"SYNC_HELPER_JOB="+cfg.JobID,
			"SYNC_HELPER_SECRET="+hex.EncodeToString(cfg.Secret),
			fmt.Sprintf("SYNC_HELPER_RANK=%d", r),
			fmt.Sprintf("SYNC_HELPER_ELEMS=%d", elems),
			fmt.Sprintf("SYNC_HELPER_OPTIMEOUT_MS=%d", opTimeout.Milliseconds()))
		if tcp {
			cmd.Env = append(cmd.Env, "SYNC_HELPER_TCP=1")
		}
		if op != "" {
			cmd.Env = append(cmd.Env, "SYNC_HELPER_OP="+op)
		}
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		k := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
		kids[r] = k
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				k.lines <- sc.Text()
			}
			close(k.lines)
		}()
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	addrs := make([]string, n)
	for r, k := range kids {
		addrs[r] = strings.TrimPrefix(k.expect(t, "ADDR ", 20*time.Second), "ADDR ")
	}
	for _, k := range kids {
		fmt.Fprintf(k.stdin, "WORLD %s\n", strings.Join(addrs, ","))
	}
	for _, k := range kids {
		k.expect(t, "RUNNING", 20*time.Second)
	}
	return kids
}

// expect waits for the child's next line with the given prefix.
func (k *child) expect(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	tm := time.NewTimer(d)
	defer tm.Stop()
	for {
		select {
		case line, ok := <-k.lines:
			if !ok {
				t.Fatalf("child %d exited before printing %q", k.cmd.Process.Pid, prefix)
			}
			if strings.HasPrefix(line, "FATAL") {
				t.Fatalf("child: %s", line)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-tm.C:
			t.Fatalf("no %q from child %d within %v", prefix, k.cmd.Process.Pid, d)
		}
	}
}

// TestPeerKilledMidAllReduce: a rank SIGKILLed while the world runs
// allreduces back to back makes every survivor fail with a *PeerError naming
// it within 2 s.
func TestPeerKilledMidAllReduce(t *testing.T) {
	t.Run("shm", func(t *testing.T) { testPeerKilled(t, false) })
	t.Run("tcp", func(t *testing.T) { testPeerKilled(t, true) })
}

func testPeerKilled(t *testing.T, tcp bool) { testPeerKilledOp(t, tcp, "") }

// testPeerKilledOp kills rank 2 of 4 children running op back to back
// (see startRanksOp) and checks the survivors' errors.
func testPeerKilledOp(t *testing.T, tcp bool, op string) { testPeerKilledOpOf(t, tcp, op, 4, 2) }

// testPeerKilledOpOf is testPeerKilledOp with n children, victim killed.
func testPeerKilledOpOf(t *testing.T, tcp bool, op string, n, victim int) {
	kids := startRanksOp(t, n, 1<<20, 30*time.Second, tcp, op)
	killed := time.Now()
	if err := kids[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for r, k := range kids {
		if r == victim {
			continue
		}
		line := k.expect(t, "ERR ", 5*time.Second)
		since := time.Since(killed)
		t.Logf("rank %d after %v: %s", r, since.Round(time.Millisecond), line)
		if since > 2*time.Second {
			t.Errorf("rank %d: error %v after the kill, want within 2s", r, since)
		}
		if !strings.Contains(line, fmt.Sprintf(" peer=%d ", victim)) || !strings.Contains(line, " lost=true ") {
			t.Errorf("rank %d: error does not name rank %d as lost: %s", r, victim, line)
		}
	}
}

// TestPeerStoppedTimesOut: a SIGSTOPped rank (alive, connections open, not
// sending) makes every other rank fail with ErrTimeout within OpTimeout.
func TestPeerStoppedTimesOut(t *testing.T) {
	const n, victim = 3, 1
	const opTimeout = time.Second
	kids := startRanks(t, n, 1<<18, opTimeout, false)
	if err := kids[victim].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for r, k := range kids {
		if r == victim {
			continue
		}
		line := k.expect(t, "ERR ", opTimeout+5*time.Second)
		t.Logf("rank %d after %v: %s", r, time.Since(stopped).Round(time.Millisecond), line)
		var secs float64
		fmt.Sscanf(line, "ERR %f", &secs)
		// The failing operation started before the stop; it must end within
		// OpTimeout of its start (plus scheduling slack).
		if el := time.Duration(secs * float64(time.Second)); el > opTimeout+500*time.Millisecond {
			t.Errorf("rank %d: operation failed after %v, OpTimeout is %v", r, el, opTimeout)
		}
		if !strings.Contains(line, " timeout=true ") {
			t.Errorf("rank %d: want ErrTimeout, got %s", r, line)
		}
	}
	kids[victim].cmd.Process.Signal(syscall.SIGCONT)
	kids[victim].cmd.Process.Kill()
}
