package testredis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterMasters is the number of master nodes StartCluster starts.
const ClusterMasters = 3

// clusterStartTimeout bounds the whole start-up of a cluster, retries
// included: on a loaded 2-core machine redis-cli's join wait alone takes a
// few seconds.
const clusterStartTimeout = 60 * time.Second

// Cluster is a real Redis Cluster of ClusterMasters masters (no replicas)
// started by StartCluster for one test. Its methods are safe for concurrent
// use.
type Cluster struct {
	addrs []string // fixed once started
	dir   string

	mu    sync.Mutex
	nodes []*exec.Cmd
}

// StartCluster starts a Redis Cluster of ClusterMasters redis-server
// processes (--cluster-enabled yes, no persistence, each with its own
// cluster config file and log in a temporary directory) on free loopback
// ports whose bus ports (port+10000) are free too, joins them with
// redis-cli --cluster create (no replicas, the 16384 slots split evenly)
// and returns once CLUSTER INFO answers cluster_state:ok on every node, at
// most 60 s later. t.Cleanup kills the processes. Needs Redis >= 5.
//
// Without redis-server or redis-cli on PATH the test is skipped, unless
// CI=true, where it fails: CI must run the cluster tests.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	server, errServer := exec.LookPath("redis-server")
	cli, errCLI := exec.LookPath("redis-cli")
	if err := errors.Join(errServer, errCLI); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("testredis: a Redis Cluster needs redis-server and redis-cli on PATH (CI=true, so no skip): %v", err)
		}
		t.Skipf("testredis: no Redis Cluster test: redis-server and redis-cli (Redis >= 5) must be on PATH: %v", err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), clusterStartTimeout)
	defer cancel()
	var lastErr error
	// A free port found by listening can be taken by someone else before
	// redis-server binds it: start again on other ports.
	for attempt := 0; attempt < 3 && ctx.Err() == nil; attempt++ {
		sub := filepath.Join(dir, strconv.Itoa(attempt))
		if err := os.Mkdir(sub, 0o700); err != nil {
			t.Fatalf("testredis: %v", err)
		}
		c := &Cluster{dir: sub}
		err := c.start(ctx, server, cli)
		if err == nil {
			t.Cleanup(c.Stop)
			return c
		}
		c.Stop()
		lastErr = err
	}
	t.Fatalf("testredis: start a Redis Cluster: %v", lastErr)
	return nil
}

func (c *Cluster) start(ctx context.Context, server, cli string) error {
	ports, err := freeClusterPorts(ClusterMasters)
	if err != nil {
		return err
	}
	for _, port := range ports {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		cmd := exec.Command(server,
			"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(c.dir, fmt.Sprintf("nodes-%d.conf", port)),
			"--cluster-node-timeout", "5000",
			"--save", "", "--appendonly", "no",
			"--protected-mode", "no", "--loglevel", "notice",
			"--dir", c.dir, "--logfile", c.logFile(port),
			"--dbfilename", fmt.Sprintf("dump-%d.rdb", port))
		// The servers die with the test binary even if Stop is never called.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("run %s: %w", server, err)
		}
		c.nodes = append(c.nodes, cmd)
		c.addrs = append(c.addrs, addr)
	}
	for i, addr := range c.addrs {
		err := poll(ctx, 20*time.Millisecond, func() error {
			if exited(c.nodes[i]) {
				return errExited
			}
			return ping(addr, 200*time.Millisecond)
		})
		if err != nil {
			return fmt.Errorf("node %s does not answer PING: %w%s", addr, err, c.logTail(addr))
		}
	}
	args := append([]string{"--cluster", "create"}, c.addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	for _, addr := range c.addrs {
		rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
		var info string
		err := poll(ctx, 20*time.Millisecond, func() error {
			var err error
			info, err = rc.ClusterInfo(ctx).Result()
			if err == nil && !strings.Contains(info, "cluster_state:ok") {
				err = errors.New("cluster_state is not ok")
			}
			return err
		})
		_ = rc.Close()
		if err != nil {
			return fmt.Errorf("node %s: %w; CLUSTER INFO:\n%s%s", addr, err, info, c.logTail(addr))
		}
	}
	return nil
}

var errExited = errors.New("redis-server exited")

// exited reports, without blocking, whether cmd's process has exited. No
// goroutine waits on the children (goleak in the packages' TestMain would
// see it).
func exited(cmd *exec.Cmd) bool {
	var ws syscall.WaitStatus
	pid, _ := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WNOHANG, nil)
	return pid == cmd.Process.Pid
}

// poll calls try every interval until it returns nil, try returns
// errExited, or ctx ends; the error then names try's last error.
func poll(ctx context.Context, interval time.Duration, try func() error) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := try()
		if err == nil || errors.Is(err, errExited) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// freeClusterPorts returns n loopback ports that were free a moment ago,
// each with its cluster bus port (port+10000, the default of every Redis
// version) free as well.
func freeClusterPorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries == 100*n {
			return nil, fmt.Errorf("find %d free port pairs p, p+10000: only %d found", n, len(ports))
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l) // held, so the kernel does not hand it out again
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		ls = append(ls, bus)
		ports = append(ports, port)
	}
	return ports, nil
}

func (c *Cluster) logFile(port int) string {
	return filepath.Join(c.dir, fmt.Sprintf("redis-%d.log", port))
}

// logTail returns the end of a node's log for an error message.
func (c *Cluster) logTail(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	b, err := os.ReadFile(c.logFile(p))
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\nlog of " + addr + ":\n" + string(b)
}

// Addrs returns the "host:port" of every master, in the order given to
// redis-cli --cluster create (which assigns slot ranges in that order).
func (c *Cluster) Addrs() []string { return append([]string(nil), c.addrs...) }

// Client returns a go-redis ClusterClient of the cluster; t.Cleanup closes
// it.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// SlotOwner asks the cluster (CLUSTER KEYSLOT, then CLUSTER SLOTS, not the
// client's own hashing) which slot key lives in and which master serves it.
func (c *Cluster) SlotOwner(ctx context.Context, key string) (slot int, addr string, err error) {
	rc := redis.NewClient(&redis.Options{Addr: c.addrs[0]})
	defer rc.Close()
	n, err := rc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return 0, "", fmt.Errorf("testredis: CLUSTER KEYSLOT %s: %w", key, err)
	}
	ranges, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		return 0, "", fmt.Errorf("testredis: CLUSTER SLOTS: %w", err)
	}
	for _, r := range ranges {
		if int64(r.Start) <= n && n <= int64(r.End) && len(r.Nodes) > 0 {
			return int(n), r.Nodes[0].Addr, nil
		}
	}
	return int(n), "", fmt.Errorf("testredis: slot %d of %s is served by no node", n, key)
}

// TagOn returns a hash tag served by the master Addrs()[node]: base plus
// "-" and the smallest number that makes the slot of "{tag}" land there. A
// key holding "{tag}" lives on that node, whatever surrounds the braces.
// Tests use it as a job ID to spread their jobs over every node on purpose.
func (c *Cluster) TagOn(t testing.TB, base string, node int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 1000 {
		tag := base + "-" + strconv.Itoa(i)
		_, addr, err := c.SlotOwner(ctx, "{"+tag+"}")
		if err != nil {
			t.Fatal(err)
		}
		if addr == c.addrs[node] {
			return tag
		}
	}
	t.Fatalf("testredis: no tag %s-N on node %s", base, c.addrs[node])
	return ""
}

// RequireOnNode fails the test unless, asking the cluster itself, every
// key of stored and of slotOnly hashes to one slot served by the master
// Addrs()[node], and every key of stored really is stored on that node
// (slotOnly is for names that hash like keys but are not stored, such as a
// Pub/Sub channel).
func (c *Cluster) RequireOnNode(t testing.TB, node int, stored []string, slotOnly ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want := c.addrs[node]
	slot0 := -1
	for _, k := range append(append([]string(nil), stored...), slotOnly...) {
		slot, addr, err := c.SlotOwner(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if slot0 < 0 {
			slot0 = slot
		}
		if slot != slot0 || addr != want {
			t.Fatalf("%s: slot %d on %s, want slot %d on %s", k, slot, addr, slot0, want)
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: want, MaxRetries: -1})
	defer rc.Close()
	if n, err := rc.Exists(ctx, stored...).Result(); err != nil || n != int64(len(stored)) {
		t.Fatalf("node %s holds %d of the %d keys %v (%v)", want, n, len(stored), stored, err)
	}
}

// Stop kills every node (SIGKILL, no save) and waits for them to exit.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range c.nodes {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	c.nodes = nil
}
