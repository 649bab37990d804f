// Package jobenv holds the launcher-side setup that the elastic example
// programs (mnist, recsys, recovery-bench) share: the store the workers
// rendezvous through, the job ID, the job secret the workers find in their
// environment (package launch puts it there), and the exit status of a
// program that is both a launcher and its workers.
package jobenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/standalone"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/monitor"
)

// EnvSecret names the environment variable that carries the job secret
// (hex) from the launcher to its workers (launch.EnvSecret, set by
// launch.Start); the secret authenticates the workers' collective
// connections and so never goes on a command line.
const EnvSecret = launch.EnvSecret

// NewJobID returns prefix + "-" + 12 random hex digits, a job ID no other
// run shares.
func NewJobID(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// CheckJobID checks a -job flag with the rule the elastic package applies
// to Config.JobID (elastic.ValidateJobID), so a bad ID is a flag error in
// the launcher rather than an error in every worker it started. The empty
// ID (a random one is drawn) is accepted.
func CheckJobID(id string) error {
	if id == "" {
		return nil
	}
	if err := elastic.ValidateJobID(id); err != nil {
		return fmt.Errorf("-job: %w", err)
	}
	return nil
}

// LaunchError returns the error a program reports for monitor.Run's err
// on job: for monitor.ErrJobAlreadyFinished, one that names the job and
// says how to train again; any other error unchanged.
func LaunchError(job string, err error) error {
	if errors.Is(err, monitor.ErrJobAlreadyFinished) {
		return fmt.Errorf("job %s already finished: its workers found it marked finished in the store, which keeps it so until the job's keys expire (%v after its last write); "+
			"to train again, pass another -job (or none, for a random one) or wait for the keys to expire",
			job, elastic.DefaultConfig().StateTTL)
	}
	return err
}

// Secret returns the job secret a worker got from its launcher through
// EnvSecret; it is an error when the variable is missing, not hex, or
// shorter than 16 bytes. (A worker the launcher started may also take it,
// with the rest of the job, from launch.WorkerEnv.)
func Secret() ([]byte, error) {
	secret, err := hex.DecodeString(os.Getenv(EnvSecret))
	if err != nil || len(secret) < 16 {
		return nil, fmt.Errorf("%s must hold the job secret (hex, at least 16 bytes)", EnvSecret)
	}
	return secret, nil
}

// Store is the Redis-protocol store of a job: either the -redis server the
// user named or an embedded one. Not safe for concurrent Close.
type Store struct {
	// Addr is the host:port the workers dial.
	Addr string
	// Desc names the store in output lines: the address given, or
	// "embedded".
	Desc string
	srv  *standalone.Server
}

// OpenStore returns the store at addr after checking that it answers a
// PING (within 3 s), so a wrong -redis flag is one clear error rather than
// N failing workers; with addr empty it starts an embedded server on a
// free loopback port instead. Errors: "-redis ADDR does not answer: ..." or
// "embedded store: ...". Close the store when the job is over.
func OpenStore(ctx context.Context, addr string) (*Store, error) {
	if addr != "" {
		if err := ping(ctx, addr); err != nil {
			return nil, err
		}
		return &Store{Addr: addr, Desc: addr}, nil
	}
	srv, err := standalone.Start(ctx, "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	return &Store{Addr: srv.Addr(), Desc: "embedded", srv: srv}, nil
}

// Close stops the embedded server, if this store started one.
func (s *Store) Close() {
	if s.srv != nil {
		s.srv.Close()
	}
}

func ping(ctx context.Context, addr string) error {
	// go-redis logs failed dials itself; the error below says it once.
	redis.SetLogger(quietRedis{})
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, MaxRetries: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("-redis %s does not answer: %w", addr, err)
	}
	return nil
}

// quietRedis discards go-redis' own log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// TempFile returns the path of a file called name in a new temporary
// directory made with os.MkdirTemp("", pattern), and a function that
// removes the directory.
func TempFile(pattern, name string) (path string, remove func(), err error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	return filepath.Join(dir, name), func() { os.RemoveAll(dir) }, nil
}

// ErrUsage is what a flag parser returns for a command line the flag
// package already complained about (printed the error and the usage);
// Run then exits with 2 without printing it again.
var ErrUsage = errors.New("bad command line")

// RunAsLauncher runs a command's run function as its main does, with the
// launcher's worker variable cleared so it acts as the launcher, and returns
// the exit code and what it wrote to stdout and stderr. For tests.
func RunAsLauncher(t testing.TB, run func(args []string, stdout, stderr io.Writer) int, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	t.Setenv(launch.EnvWorker, "")
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

// MarkFinished marks job finished in the Redis at addr, as the final rank 0
// of a run of that job ID does (a member joins alone and finishes it): what
// a later run with that job ID then finds. For tests.
func MarkFinished(ctx context.Context, addr, job string) error {
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	cfg := elastic.DefaultConfig()
	cfg.JobID, cfg.LastCall = job, 0
	agent, err := elastic.NewAgent(store.NewRedis(client), elastic.NewMember("127.0.0.1:1"), cfg)
	if err != nil {
		return err
	}
	defer agent.Close()
	if _, err := agent.Join(ctx); err != nil {
		return err
	}
	return agent.Finish(ctx)
}

// ParseFlags parses args with fs. On a bad flag the flag package prints the
// error; ParseFlags adds one line pointing at -h (not the whole flag list)
// and returns ErrUsage. -h prints every flag and returns flag.ErrHelp.
// Arguments left over are an error.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
		return err
	case err != nil:
		fmt.Fprintf(fs.Output(), "run %s -h for the list of flags\n", fs.Name())
		return ErrUsage
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return nil
}

// Run is the body of the main function of a program that is both the
// launcher of a job and its workers. parseErr is the error of parsing the
// command line: flag.ErrHelp exits 0, ErrUsage exits 2, any other error
// exits 2 after printing "name: error" to stderr. In a worker (the
// launcher's EnvWorker variable set) it returns worker's exit code;
// otherwise it runs launch with a context cancelled by SIGINT or SIGTERM
// (which the launcher forwards to every worker as a SIGTERM) and returns
// 0; launch.StatusPreempted (143) after printing "name: job preempted"
// when the error wraps launch.ErrPreempted (every worker left gracefully
// on the signal); or 1 after printing "name: error" to stderr.
func Run(name string, stderr io.Writer, parseErr error, worker func() int, launchJob func(context.Context) error) int {
	switch {
	case errors.Is(parseErr, flag.ErrHelp):
		return 0
	case errors.Is(parseErr, ErrUsage):
		return 2
	case parseErr != nil:
		fmt.Fprintf(stderr, "%s: %v\n", name, parseErr)
		return 2
	}
	if os.Getenv(launch.EnvWorker) != "" {
		return worker()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := launchJob(ctx)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, launch.ErrPreempted):
		fmt.Fprintf(stderr, "%s: job preempted: %v\n", name, err)
		return launch.StatusPreempted
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 1
}
