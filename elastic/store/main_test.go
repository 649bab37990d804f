package store_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/internal/testredis"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial.
	redis.SetLogger(quietLogger{})
	testredis.VerifyTestMain(m)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
