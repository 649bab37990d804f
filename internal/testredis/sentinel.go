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

	"github.com/elastictrain/elastictrain/internal/freeport"
)

// SentinelMaster is the master name the Sentinels of StartSentinel monitor.
const SentinelMaster = "elastictrain"

// Sentinels is the number of redis-sentinel processes StartSentinel starts;
// SentinelQuorum of them must agree that the master is down.
const (
	Sentinels      = 3
	SentinelQuorum = 2
)

// SentinelDownAfter is the Sentinels' down-after-milliseconds: how long the
// master may not answer before a Sentinel thinks it down. Small, so a test
// sees a failover within a few seconds.
const SentinelDownAfter = 500 * time.Millisecond

// sentinelStartTimeout bounds StartSentinel, waits for discovery included
// (Sentinels find each other through hello messages every 2 s).
const sentinelStartTimeout = 60 * time.Second

// SentinelConfig changes how StartSentinel wires the set. The zero value is
// a replica replicating straight from the master.
type SentinelConfig struct {
	// ReplicaLink, when set, is called with the master's address once the
	// master answers and returns the address the replica replicates from
	// (a fault-injecting proxy in front of the master, so a test can hold
	// the replication stream back and lose the writes a failover drops).
	ReplicaLink func(master string) (string, error)
}

// SentinelSet is a real Redis master, one replica and Sentinels processes
// watching them (redis-server and redis-sentinel, no persistence, on free
// loopback ports), started by StartSentinel for one test. Its methods are
// safe for concurrent use.
type SentinelSet struct {
	dir       string
	master    string // address of the first master
	replica   string
	sentinels []string

	mu    sync.Mutex
	procs map[string]*exec.Cmd // by address
}

// StartSentinel starts a master, a replica of it (through cfg.ReplicaLink's
// address when set) and Sentinels Sentinels monitoring the master as
// SentinelMaster with quorum SentinelQuorum, down-after-milliseconds
// SentinelDownAfter and a failover timeout of 1 s. It returns once the
// replica is in sync and every Sentinel knows the replica and the other
// Sentinels, so a failover can start at once; at most 60 s later.
// t.Cleanup kills every process.
//
// Without redis-server or redis-sentinel on PATH the test is skipped,
// unless CI=true, where it fails: CI must run the failover tests.
func StartSentinel(t testing.TB, cfg SentinelConfig) *SentinelSet {
	t.Helper()
	server, errServer := exec.LookPath("redis-server")
	sentinel, errSentinel := exec.LookPath("redis-sentinel")
	if err := errors.Join(errServer, errSentinel); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("testredis: a Sentinel set needs redis-server and redis-sentinel on PATH (CI=true, so no skip): %v", err)
		}
		t.Skipf("testredis: no Sentinel test: redis-server and redis-sentinel (Debian: apt-get install redis-sentinel) must be on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sentinelStartTimeout)
	defer cancel()
	s := &SentinelSet{dir: t.TempDir(), procs: map[string]*exec.Cmd{}}
	t.Cleanup(s.Stop)
	if err := s.start(ctx, server, sentinel, cfg); err != nil {
		t.Fatalf("testredis: start a Sentinel set: %v", err)
	}
	return s
}

func (s *SentinelSet) start(ctx context.Context, server, sentinel string, cfg SentinelConfig) error {
	var err error
	if s.master, err = s.startServer(ctx, server); err != nil {
		return fmt.Errorf("master: %w", err)
	}
	link := s.master
	if cfg.ReplicaLink != nil {
		if link, err = cfg.ReplicaLink(s.master); err != nil {
			return fmt.Errorf("replica link: %w", err)
		}
	}
	mhost, mport, _ := net.SplitHostPort(link)
	if s.replica, err = s.startServer(ctx, server, "--replicaof", mhost, mport); err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	rc := redis.NewClient(&redis.Options{Addr: s.replica, MaxRetries: -1})
	defer rc.Close()
	if err := poll(ctx, 20*time.Millisecond, func() error {
		info, err := rc.Info(ctx, "replication").Result()
		if err == nil && !strings.Contains(info, "master_link_status:up") {
			err = errors.New("replica not in sync")
		}
		return err
	}); err != nil {
		return fmt.Errorf("replica %s: %w%s", s.replica, err, s.logTail(s.replica))
	}
	host, port, _ := net.SplitHostPort(s.master)
	for range Sentinels {
		addr, err := s.startSentinel(ctx, sentinel, host, port)
		if err != nil {
			return err
		}
		s.sentinels = append(s.sentinels, addr)
	}
	// Every Sentinel must know the replica (from the master's INFO) and
	// the other Sentinels (from their hello messages) before a failover
	// can be agreed and carried out.
	for _, addr := range s.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1})
		err := poll(ctx, 50*time.Millisecond, func() error {
			reps, err := sc.Replicas(ctx, SentinelMaster).Result()
			if err != nil {
				return err
			}
			if len(reps) != 1 {
				return fmt.Errorf("knows %d replicas, want 1", len(reps))
			}
			others, err := sc.Sentinels(ctx, SentinelMaster).Result()
			if err != nil {
				return err
			}
			if len(others) != Sentinels-1 {
				return fmt.Errorf("knows %d other Sentinels, want %d", len(others), Sentinels-1)
			}
			return nil
		})
		_ = sc.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w%s", addr, err, s.logTail(addr))
		}
	}
	return nil
}

// startServer starts one redis-server on a free port with extra arguments
// and waits for its PING, retrying on another port when the first is
// taken.
func (s *SentinelSet) startServer(ctx context.Context, bin string, extra ...string) (string, error) {
	return s.startProc(ctx, func(addr, port string) *exec.Cmd {
		args := append([]string{
			"--bind", "127.0.0.1", "--port", port,
			"--save", "", "--appendonly", "no",
			"--protected-mode", "no", "--loglevel", "notice",
			"--dir", s.dir, "--logfile", s.logFile(addr),
			"--dbfilename", "dump-" + port + ".rdb",
		}, extra...)
		return exec.Command(bin, args...)
	})
}

func (s *SentinelSet) startSentinel(ctx context.Context, bin, masterHost, masterPort string) (string, error) {
	return s.startProc(ctx, func(addr, port string) *exec.Cmd {
		// A Sentinel rewrites its configuration file, so each has its own.
		conf := filepath.Join(s.dir, "sentinel-"+port+".conf")
		text := strings.Join([]string{
			"bind 127.0.0.1",
			"port " + port,
			"protected-mode no",
			"dir " + s.dir,
			"logfile " + s.logFile(addr),
			fmt.Sprintf("sentinel monitor %s %s %s %d", SentinelMaster, masterHost, masterPort, SentinelQuorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", SentinelMaster, SentinelDownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s 1000", SentinelMaster),
			fmt.Sprintf("sentinel parallel-syncs %s 1", SentinelMaster),
			"",
		}, "\n")
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return nil
		}
		return exec.Command(bin, conf)
	})
}

func (s *SentinelSet) startProc(ctx context.Context, command func(addr, port string) *exec.Cmd) (string, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		addr, err := freeport.Addr()
		if err != nil {
			return "", err
		}
		_, port, _ := net.SplitHostPort(addr)
		cmd := command(addr, port)
		if cmd == nil {
			return "", fmt.Errorf("write the configuration of %s", addr)
		}
		// The processes die with the test binary even if Stop is never called.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return "", fmt.Errorf("run %s: %w", cmd.Path, err)
		}
		err = poll(ctx, 20*time.Millisecond, func() error {
			if exited(cmd) {
				return errExited
			}
			return ping(addr, 200*time.Millisecond)
		})
		if err == nil {
			s.mu.Lock()
			s.procs[addr] = cmd
			s.mu.Unlock()
			return addr, nil
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		lastErr = fmt.Errorf("%s on %s: %w%s", filepath.Base(cmd.Path), addr, err, s.logTail(addr))
	}
	return "", lastErr
}

func (s *SentinelSet) logFile(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return filepath.Join(s.dir, "redis-"+port+".log")
}

// logTail returns the end of a process's log for an error message.
func (s *SentinelSet) logTail(addr string) string {
	b, err := os.ReadFile(s.logFile(addr))
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\nlog of " + addr + ":\n" + string(b)
}

// Log returns the whole log of the process at addr (a server or a
// Sentinel of the set), for a test's failure message.
func (s *SentinelSet) Log(addr string) string {
	b, _ := os.ReadFile(s.logFile(addr))
	return string(b)
}

// MasterAddr returns the address of the master the set started with.
func (s *SentinelSet) MasterAddr() string { return s.master }

// ReplicaAddr returns the address of the replica the set started with.
func (s *SentinelSet) ReplicaAddr() string { return s.replica }

// SentinelAddrs returns the Sentinels' addresses.
func (s *SentinelSet) SentinelAddrs() []string { return append([]string(nil), s.sentinels...) }

// CurrentMaster asks the Sentinels, in turn, which address serves as
// SentinelMaster now (SENTINEL GET-MASTER-ADDR-BY-NAME), and returns the
// first answer.
func (s *SentinelSet) CurrentMaster(ctx context.Context) (string, error) {
	var errs []error
	for _, addr := range s.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
		hp, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
		_ = sc.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		errs = append(errs, fmt.Errorf("%s: %v", addr, err))
	}
	return "", fmt.Errorf("testredis: no Sentinel names the master: %w", errors.Join(errs...))
}

// Kill SIGKILLs the server or Sentinel at addr (no save, no goodbye) and
// waits for it to exit. Killing an address that is not running does
// nothing.
func (s *SentinelSet) Kill(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cmd, ok := s.procs[addr]; ok {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		delete(s.procs, addr)
	}
}

// Stop kills every process of the set and waits for them to exit.
func (s *SentinelSet) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr, cmd := range s.procs {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		delete(s.procs, addr)
	}
}

// ReplOffset returns the replication offset the server at addr reports in
// INFO replication: master_repl_offset on a master, and on a replica the
// offset it has processed (slave_repl_offset). The difference between a
// master's and its replica's is the bytes of writes the replica lacks.
func ReplOffset(ctx context.Context, addr string) (int64, error) {
	info, err := replicationInfo(ctx, addr)
	if err != nil {
		return 0, err
	}
	field := "master_repl_offset"
	if strings.Contains(info, "role:slave") {
		field = "slave_repl_offset"
	}
	return infoInt(info, addr, field)
}

// PromotionOffset returns the replication offset a server at addr held
// when it was promoted from replica to master: Redis (4.0 and later)
// reports it as second_repl_offset minus one, and it stays fixed while the
// new master takes writes, so it tells which of the old master's writes
// the new one had received however long after the promotion it is read.
// A server that was never promoted (second_repl_offset -1) is an error.
func PromotionOffset(ctx context.Context, addr string) (int64, error) {
	info, err := replicationInfo(ctx, addr)
	if err != nil {
		return 0, err
	}
	second, err := infoInt(info, addr, "second_repl_offset")
	if err != nil {
		return 0, err
	}
	if second < 1 {
		return 0, fmt.Errorf("testredis: %s was never promoted (second_repl_offset %d)", addr, second)
	}
	return second - 1, nil
}

func replicationInfo(ctx context.Context, addr string) (string, error) {
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer rc.Close()
	info, err := rc.Info(ctx, "replication").Result()
	if err != nil {
		return "", fmt.Errorf("testredis: INFO replication of %s: %w", addr, err)
	}
	return info, nil
}

func infoInt(info, addr, field string) (int64, error) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("testredis: INFO replication of %s has no %s", addr, field)
}
