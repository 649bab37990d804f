package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
)

const childEnv = "RENDEZVOUS_BENCH_CHILD"

// event is one line a child prints: a World it holds, with the wall-clock
// time (ns) at which Join returned it.
type event struct {
	Round uint64 `json:"round"`
	Size  int    `json:"size"`
	At    int64  `json:"at"`
	Err   string `json:"err,omitempty"`
}

// killRecovery starts procs child processes that form one round, SIGKILLs one
// and returns the time until every survivor holds a World of procs-1
// members. viaReport: the survivors report the death when their ring
// connection to the dead peer closes; otherwise nobody reports and the
// lease lapses (the survivors' ring connections are ignored).
func killRecovery(ctx context.Context, addr string, procs int, lease time.Duration, viaReport bool, rep int) (time.Duration, error) {
	job := jobID("kill", rep)
	type proc struct {
		cmd    *exec.Cmd
		events chan event
	}
	ps := make([]*proc, procs)
	defer func() {
		for _, p := range ps {
			if p != nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		}
	}()
	for i := range ps {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), childEnv+"=1", "RB_REDIS="+addr, "RB_JOB="+job,
			"RB_N="+strconv.Itoa(procs), "RB_LEASE="+lease.String(), "RB_REPORT="+strconv.FormatBool(viaReport))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		p := &proc{cmd: cmd, events: make(chan event, 16)}
		go func() {
			defer close(p.events)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var e event
				if json.Unmarshal(sc.Bytes(), &e) == nil {
					p.events <- e
				}
			}
		}()
		ps[i] = p
	}
	await := func(ps []*proc, size int, timeout time.Duration) (time.Time, error) {
		deadline := time.After(timeout)
		var latest time.Time
		for _, p := range ps {
			for {
				select {
				case e, ok := <-p.events:
					if !ok {
						return time.Time{}, errors.New("a child exited")
					}
					if e.Err != "" {
						return time.Time{}, errors.New(e.Err)
					}
					if e.Size != size {
						continue
					}
					if t := time.Unix(0, e.At); t.After(latest) {
						latest = t
					}
				case <-deadline:
					return time.Time{}, fmt.Errorf("no World of %d within %v", size, timeout)
				}
				break
			}
		}
		return latest, nil
	}
	if _, err := await(ps, procs, time.Minute); err != nil {
		return 0, err
	}
	victim := ps[procs/2]
	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		return 0, err
	}
	_ = victim.cmd.Wait()
	ps[procs/2] = nil
	var survivors []*proc
	for _, p := range ps {
		if p != nil {
			survivors = append(survivors, p)
		}
	}
	at, err := await(survivors, procs-1, lease+time.Minute)
	if err != nil {
		return 0, err
	}
	return at.Sub(killed), nil
}

// childMain is one worker process: it joins, keeps a ring connection to the
// next rank (as a collective would), and re-joins whenever a change is
// pending. In report mode, a ring connection that closes without a goodbye
// is reported as a failed peer.
func childMain() int {
	out := json.NewEncoder(os.Stdout)
	n, _ := strconv.Atoi(os.Getenv("RB_N"))
	lease, _ := time.ParseDuration(os.Getenv("RB_LEASE"))
	viaReport := os.Getenv("RB_REPORT") == "true"
	cfg := baseConfig(os.Getenv("RB_JOB"))
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, n, time.Hour // forms at exactly n
	cfg.LeaseTTL = lease
	cfg.HeartbeatInterval = min(cfg.HeartbeatInterval, lease/4)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = out.Encode(event{Err: err.Error()})
		return 1
	}
	defer ln.Close()
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{os.Getenv("RB_REDIS")}})
	defer c.Close()
	a, err := elastic.NewAgent(store.NewRedis(c), elastic.NewMember(ln.Addr().String()), cfg)
	if err != nil {
		_ = out.Encode(event{Err: err.Error()})
		return 1
	}
	defer a.Close()
	ctx := context.Background()
	ring := &ring{a: a, report: viaReport}
	go ring.accept(ln)
	for {
		w, err := a.Join(ctx)
		if err != nil {
			_ = out.Encode(event{Err: err.Error()})
			return 1
		}
		at := time.Now().UnixNano()
		// Connect the ring before announcing the World, so that a kill that
		// follows the announcement always finds the connections in place.
		ring.connect(w)
		_ = out.Encode(event{Round: w.Round, Size: w.Size, At: at})
		for !a.ChangePending() {
			<-a.Changes()
		}
		ring.closeRound()
	}
}

// ring keeps this member's connections of the current round: one dialled to
// the next rank, one accepted from the previous rank.
type ring struct {
	a      *elastic.Agent
	report bool
	mu     sync.Mutex
	conns  []net.Conn
}

func (r *ring) connect(w elastic.World) {
	if w.Size < 2 {
		return
	}
	next := w.Members[(w.Rank+1)%w.Size]
	conn, err := net.Dial("tcp", next.Addr)
	if err != nil {
		return // the peer is gone already; the rendezvous will notice
	}
	fmt.Fprintf(conn, "H %d %s\n", w.Round, r.a.Member().ID)
	r.watch(conn, conn, w.Round, next.ID)
}

func (r *ring) accept(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			br := bufio.NewReader(conn)
			line, err := br.ReadString('\n')
			f := strings.Fields(line)
			if err != nil || len(f) != 3 {
				_ = conn.Close()
				return
			}
			round, _ := strconv.ParseUint(f[1], 10, 64)
			r.watch(conn, br, round, f[2])
		}()
	}
}

// watch reads from a ring connection until it closes; a close without the
// goodbye byte 'B' means the peer died. A connection is kept until this
// member leaves its round (closeRound), even if it names a round this
// member has not reached yet.
func (r *ring) watch(conn net.Conn, rd io.Reader, round uint64, peer string) {
	r.mu.Lock()
	r.conns = append(r.conns, conn)
	r.mu.Unlock()
	go func() {
		buf := make([]byte, 1)
		goodbye := false
		for {
			_, err := rd.Read(buf)
			if err != nil {
				if errors.Is(err, io.EOF) || !errors.Is(err, net.ErrClosed) {
					break
				}
				return // closed by us
			}
			if buf[0] == 'B' {
				goodbye = true
			}
		}
		if !goodbye && r.report {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = r.a.ReportFailure(ctx, round, peer)
			cancel()
		}
	}()
}

func (r *ring) closeRound() {
	r.mu.Lock()
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	for _, c := range conns {
		_, _ = c.Write([]byte{'B'})
		_ = c.Close()
	}
}
