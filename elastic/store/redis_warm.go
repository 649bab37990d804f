package store

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Warm makes the client's connection pool hold about n open connections
// (n >= 1), by sending n PINGs at once through the pool (each PING in
// flight holds a connection of its own; not through Client.Conn, whose
// sticky connections share the client's options without its lock, a data
// race inside go-redis with a Subscribe dialling at the same time). The
// Agent keeps several heartbeats in flight on a slow link, each on a
// connection of its own; a heartbeat that has to dial its connection first
// pays two more round trips on that link (the TCP and go-redis handshakes),
// enough on a link slower than about a third of the lease to let the lease
// lapse in Redis although every heartbeat was sent in time. Agents call Warm
// (an optional capability of a Store, found by type assertion) when they
// start and every few minutes, within go-redis' ConnMaxIdleTime (30 min by
// default). Only a *redis.Client (one node or Sentinel failover) is warmed;
// for other clients Warm does nothing. Errors: the first failed PING.
func (s *Redis) Warm(ctx context.Context, n int) error {
	c, ok := s.c.(*redis.Client)
	if !ok || n < 1 {
		return nil
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Ping(ctx).Err()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
