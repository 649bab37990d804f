package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// privateRedis is a redis-server child process on a free loopback port, so
// a run of hundreds or thousands of members never loads a shared Redis.
type privateRedis struct {
	cmd  *exec.Cmd
	addr string
}

// startPrivateRedis starts redis-server (from PATH) with persistence off
// and room for maxClients connections, and waits until it answers PING.
func startPrivateRedis(ctx context.Context, maxClients int) (*privateRedis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--maxclients", strconv.Itoa(maxClients), "--tcp-backlog", "4096")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the bench
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &privateRedis{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			return s, nil
		} else if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s does not answer: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *privateRedis) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// redisCPU returns the CPU time (user + system) the Redis server has used,
// from INFO cpu.
func redisCPU(ctx context.Context, c redis.UniversalClient) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s=%q: %w", k, v, err)
		}
		total += f
		found++
	}
	if found != 2 {
		return 0, errors.New("INFO cpu has no used_cpu_sys/used_cpu_user (not a real Redis?)")
	}
	return time.Duration(total * float64(time.Second)), nil
}

// selfCPU returns the CPU time (user + system) of this process.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// commandStat is one command's line of INFO commandstats.
type commandStat struct {
	calls int64
	usec  int64
}

// commandStats returns INFO commandstats by command name ("evalsha", ...).
func commandStats(ctx context.Context, c redis.UniversalClient) (map[string]commandStat, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]commandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st commandStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls = n
			case "usec":
				st.usec = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out, nil
}

// statsDelta formats the busiest commands between two snapshots: calls and
// microseconds per call (Redis' own accounting, wall time inside the
// command, so a descheduled Redis inflates it).
func statsDelta(a, b map[string]commandStat) string {
	type row struct {
		name string
		st   commandStat
	}
	var rows []row
	for name, sb := range b {
		sa := a[name]
		if d := (commandStat{sb.calls - sa.calls, sb.usec - sa.usec}); d.calls > 0 {
			rows = append(rows, row{name, d})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].st.usec > rows[j].st.usec })
	var parts []string
	for i, r := range rows {
		if i == 4 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s:%d calls %.1fus/call", r.name, r.st.calls, float64(r.st.usec)/float64(r.st.calls)))
	}
	return strings.Join(parts, " ")
}
