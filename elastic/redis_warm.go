package elastic

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Warm makes the client's connection pool hold at least n open connections
// (n >= 1), by taking n of them at once and sending a PING on each. The
// Agent keeps several heartbeats in flight on a slow link, each on a
// connection of its own; a heartbeat that has to dial its connection first
// pays two more round trips on that link (the TCP and go-redis handshakes),
// enough on a link slower than about a third of the lease to let the lease
// lapse in Redis although every heartbeat was sent in time. Agents call Warm
// (an optional capability of a Store, found by type assertion) when they
// start and every few minutes, within go-redis' ConnMaxIdleTime (30 min by
// default). Only a *redis.Client (one node or Sentinel failover) is warmed;
// for other clients Warm does nothing. Errors: the first failed PING.
func (s *RedisStore) Warm(ctx context.Context, n int) error {
	c, ok := s.c.(*redis.Client)
	if !ok || n < 1 {
		return nil
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		conn := c.Conn()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = conn.Ping(ctx).Err()
			_ = conn.Close() // back to the pool
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
