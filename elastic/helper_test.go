package elastic_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
)

// Child processes: the test binary re-executed with helperEnv set. They join
// a job through real Redis and print one JSON event per line on stdout.

const helperEnv = "ELASTIC_TEST_HELPER"

type childEvent struct {
	Event   string   `json:"event"` // "world", "fenced-report", "fenced-join", "error"
	ID      string   `json:"id"`
	Round   uint64   `json:"round"`
	Rank    int      `json:"rank"`
	Size    int      `json:"size"`
	Members []string `json:"members"`
	Fenced  bool     `json:"fenced"`
	Err     string   `json:"err"`
}

type childSpec struct {
	mode      string // "member" or "paused"
	addr      string
	cfg       elastic.Config
	extraEnvs []string
}

func helperMain(mode string) int {
	out := json.NewEncoder(os.Stdout)
	emit := func(e childEvent) { _ = out.Encode(e) }
	cfg := elastic.DefaultConfig()
	cfg.JobID = os.Getenv("ET_JOB")
	atoi := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	dur := func(k string) time.Duration { d, _ := time.ParseDuration(os.Getenv(k)); return d }
	cfg.MinWorkers, cfg.MaxWorkers = atoi("ET_MIN"), atoi("ET_MAX")
	cfg.LastCall, cfg.LeaseTTL = dur("ET_LASTCALL"), dur("ET_LEASE")
	cfg.HeartbeatInterval, cfg.PollInterval = dur("ET_HB"), dur("ET_POLL")
	cfg.JoinTimeout = 60 * time.Second
	c := newClient(os.Getenv("ET_REDIS"))
	defer c.Close()
	a, err := elastic.NewAgent(store.NewRedis(c), elastic.NewMember("127.0.0.1:1"), cfg)
	if err != nil {
		emit(childEvent{Event: "error", Err: err.Error()})
		return 1
	}
	defer a.Close()
	id := a.Member().ID
	ctx := context.Background()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		w, err := a.Join(ctx)
		if err != nil {
			emit(childEvent{Event: "error", ID: id, Err: err.Error(), Fenced: errors.Is(err, elastic.ErrFenced)})
			return 1
		}
		emit(childEvent{Event: "world", ID: id, Round: w.Round, Rank: w.Rank, Size: w.Size, Members: w.MemberIDs()})
		for !a.ChangePending() {
			select {
			case <-a.Changes():
			case <-tick.C:
			}
		}
		if mode == "paused" {
			// Woken after a pause: try to act under the old rank.
			peer := w.Members[(w.Rank+1)%w.Size].ID
			err := a.ReportFailure(ctx, w.Round, peer)
			emit(childEvent{Event: "fenced-report", ID: id, Round: w.Round, Fenced: errors.Is(err, elastic.ErrFenced), Err: fmt.Sprint(err)})
			_, err = a.Join(ctx)
			emit(childEvent{Event: "fenced-join", ID: id, Fenced: errors.Is(err, elastic.ErrFenced), Err: fmt.Sprint(err)})
			return 0
		}
	}
}

type child struct {
	cmd    *exec.Cmd
	events chan childEvent
}

func startChild(t *testing.T, spec childSpec) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		helperEnv+"="+spec.mode,
		"ET_REDIS="+spec.addr,
		"ET_JOB="+spec.cfg.JobID,
		fmt.Sprintf("ET_MIN=%d", spec.cfg.MinWorkers),
		fmt.Sprintf("ET_MAX=%d", spec.cfg.MaxWorkers),
		"ET_LASTCALL="+spec.cfg.LastCall.String(),
		"ET_LEASE="+spec.cfg.LeaseTTL.String(),
		"ET_HB="+spec.cfg.HeartbeatInterval.String(),
		"ET_POLL="+spec.cfg.PollInterval.String(),
	)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, events: make(chan childEvent, 64)}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(c.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e childEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e = childEvent{Event: "error", Err: "unparsable line: " + sc.Text()}
			}
			c.events <- e
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		for range c.events {
		}
		<-readDone
		_ = cmd.Wait()
	})
	return c
}

// next returns the child's next event, failing the test after timeout.
func (c *child) next(t *testing.T, timeout time.Duration) childEvent {
	t.Helper()
	select {
	case e, ok := <-c.events:
		if !ok {
			t.Fatalf("child %d exited", c.cmd.Process.Pid)
		}
		if e.Event == "error" {
			t.Fatalf("child %d: %s", c.cmd.Process.Pid, e.Err)
		}
		return e
	case <-time.After(timeout):
		t.Fatalf("child %d: no event within %v", c.cmd.Process.Pid, timeout)
	}
	return childEvent{}
}
