package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// ErrJobInUse is Start's error when Config.Redis holds the mark of another
// launcher that runs the same job ID with another job secret: its workers
// would be strangers to the running job (they fail its authentication), so
// Start refuses before any worker starts. The message names the job ID,
// the other launcher and how to go on. Launchers that share the secret
// (EnvSecret set to the same value on several hosts) share the job.
var ErrJobInUse = errors.New("launch: the job ID is in use by another launcher")

// markTTL is how long a launcher's mark outlives its last refresh (a
// launcher that was killed); it is refreshed every markTTL/3.
const markTTL = 10 * time.Second

// marker holds a launcher's mark on its job in Config.Redis while the job
// runs: claimed by Start, refreshed by its goroutine, deleted by release.
type marker struct {
	c      *redis.Client
	s      *store.Redis // over c
	jobID  string
	owner  string // store.MarkOwner of the job secret
	note   string // this launcher's pid and host (for the other's error)
	log    *slog.Logger
	stop   chan struct{}
	closed chan struct{}
}

// claimMark claims job's mark in the Redis at addr for a launcher of
// secret, or returns ErrJobInUse when another secret's launcher holds it.
// A store that cannot keep the mark gives a nil marker and a WARN.
func claimMark(ctx context.Context, addr, jobID string, secret []byte, log *slog.Logger) (*marker, error) {
	host, _ := os.Hostname()
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, MaxRetries: -1})
	m := &marker{
		c: c, s: store.NewRedis(c), jobID: jobID, owner: store.MarkOwner(secret), note: strconv.Itoa(os.Getpid()) + " " + host, log: log,
		stop: make(chan struct{}), closed: make(chan struct{}),
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	other, err := m.set(cctx)
	switch {
	case err != nil && ctx.Err() != nil:
		m.c.Close()
		return nil, fmt.Errorf("launch: %w", ctx.Err())
	case err != nil:
		// The mark is a guard, not the job: a store that answers PING but
		// not this (a Redis Cluster node that owns another slot, a store
		// without scripts) launches the job unguarded.
		m.c.Close()
		log.Warn("could not check the job's launcher mark in the store; a second launcher of this job ID would not be refused", "err", err)
		return nil, nil
	case other != "":
		m.c.Close()
		return nil, inUse(jobID, addr, other)
	}
	go m.refresh()
	return m, nil
}

// set sets the mark and returns "" or, when another secret's launcher
// holds it, that launcher's mark.
func (m *marker) set(ctx context.Context) (string, error) {
	v, err := m.s.Mark(ctx, m.jobID, m.owner, m.note, markTTL)
	if err != nil {
		return "", fmt.Errorf("launch: the job's launcher mark in the store: %w", err)
	}
	return v, nil
}

// inUse is ErrJobInUse for the other launcher's mark other.
func inUse(jobID, addr, other string) error {
	who := "another launcher"
	if f := strings.Fields(other); len(f) >= 3 {
		who = fmt.Sprintf("another launcher (pid %s on host %s)", f[1], f[2])
	}
	return fmt.Errorf("%w: job %s is running on the store %s under %s with another job secret, so workers started here would be strangers to it: "+
		"pass another job ID, or stop that launcher first (its mark expires %v after it stops)",
		ErrJobInUse, jobID, addr, who, markTTL)
}

// refresh keeps the mark alive until release. A store that does not
// answer is the workers' concern (their outage budget): the launcher goes
// on and says so once; a mark taken over by another secret's launcher in
// the meantime (ours expired) is an ERROR, once.
func (m *marker) refresh() {
	defer close(m.closed)
	t := time.NewTicker(markTTL / 3)
	defer t.Stop()
	failing, taken := false, false
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), markTTL/3)
		other, err := m.set(ctx)
		cancel()
		switch {
		case err != nil && !failing:
			failing = true
			m.log.Warn("could not refresh the job's launcher mark; another launcher could start this job ID once it expires", "err", err)
		case err == nil && other != "" && !taken:
			taken = true
			m.log.Error("another launcher with another job secret took this job ID after its mark expired; its workers are strangers to this job",
				"job", m.jobID, "other", other)
		case err == nil:
			failing = false
		}
	}
}

// release stops the refresh and deletes the mark when it is still this
// launcher's. Called once, when the job is over.
func (m *marker) release() {
	close(m.stop)
	<-m.closed
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := m.s.Unmark(ctx, m.jobID, m.owner, m.note); err != nil {
		m.log.Debug("could not delete the job's launcher mark; it expires", "ttl", markTTL, "err", err)
	}
	m.c.Close()
}
