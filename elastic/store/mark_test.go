package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// A launcher mark is shared by the launchers of one secret, refused to
// another secret's while it is held, renewed for its TTL by each Mark, and
// deleted only by the launcher that wrote it.
func TestLauncherMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testredis.Client(t)
	s := store.NewRedis(c)
	job := testredis.JobID(t)
	key := store.KeyPrefix + "{" + job + "}:launcher"
	a, b := store.MarkOwner([]byte("the job's secret, 32 bytes long.")), store.MarkOwner([]byte("another secret, also 32 bytes..."))
	require.Len(t, a, 16)
	require.NotEqual(t, a, b)
	require.Equal(t, a, store.MarkOwner([]byte("the job's secret, 32 bytes long.")), "one secret, one owner")

	other, err := s.Mark(ctx, job, a, "1 host-a", time.Minute)
	require.NoError(t, err)
	require.Empty(t, other, "a free job ID is claimed")
	ttl, err := c.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.True(t, ttl > 0 && ttl <= time.Minute, "the mark has the TTL asked: %v", ttl)

	other, err = s.Mark(ctx, job, a, "2 host-b", time.Minute)
	require.NoError(t, err)
	require.Empty(t, other, "a launcher of the same secret shares the mark")

	other, err = s.Mark(ctx, job, b, "3 host-c", time.Minute)
	require.NoError(t, err)
	require.Equal(t, a+" 2 host-b", other, "another secret's launcher learns who holds the job ID")

	require.NoError(t, s.Unmark(ctx, job, a, "1 host-a"))
	require.NoError(t, c.Get(ctx, key).Err(), "a mark renewed by another launcher is not deleted by the first")
	require.NoError(t, s.Unmark(ctx, job, a, "2 host-b"))
	require.ErrorIs(t, c.Get(ctx, key).Err(), redis.Nil, "the launcher that holds the mark deletes it")

	other, err = s.Mark(ctx, job, b, "3 host-c", time.Minute)
	require.NoError(t, err)
	require.Empty(t, other, "free again once released")
	require.NoError(t, s.Unmark(ctx, job, b, "3 host-c"))

	_, err = s.Mark(ctx, "bad {job}", a, "x", time.Minute)
	var se *store.Error
	require.ErrorAs(t, err, &se, "an invalid job ID is refused")
}
