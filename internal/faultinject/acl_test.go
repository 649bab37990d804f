package faultinject_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// Redis AUTH with an ACL user and password, set through go-redis options
// (redis.Options.Username/Password): a job whose workers log in as a user
// restricted to the job keys (et:*) and channels trains to the end with
// every invariant; with a wrong password a worker fails with a clear error
// instead of hanging; without credentials the server refuses.
func TestRedisACLUser(t *testing.T) {
	ctx := context.Background()
	srv := testredis.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	const user, password = "trainer", "a long password for the trainer user"
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+password,
		"resetkeys", "~et:*", "resetchannels", "&et:*", "+@all", "-@dangerous").Err())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "default", "off").Err())

	anon := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer anon.Close()
	require.Error(t, anon.Ping(ctx).Err(), "the default user is off")

	cfg := testConfig(t, srv.Addr())
	cfg.Epochs = 1
	cfg.RedisUser, cfg.RedisPassword = user, password
	res := faultinject.Run(ctx, cfg, nil, faultinject.Bounds{})
	require.Empty(t, res.Violations)
	require.Equal(t, 3, res.Finished)

	// A wrong password is a clear error within the outage budget.
	bad := testConfig(t, srv.Addr())
	bad.Workers, bad.MinWorkers = 1, 1
	bad.OutageBudget = 2 * time.Second
	bad.RedisUser, bad.RedisPassword = user, "wrong password"
	h, err := faultinject.Start(ctx, bad)
	require.NoError(t, err)
	defer h.Close()
	bound, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.Empty(t, h.WaitExit(bound), "the worker exits")
	r := h.Result(h.Workers()[0])
	require.Equal(t, faultinject.ExitError, r.ExitCode)
	require.Contains(t, r.Err, "WRONGPASS")
}
