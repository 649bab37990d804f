package faultinject_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

func testConfig(t *testing.T, redisAddr string) faultinject.Config {
	cfg := faultinject.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.JobID = testredis.JobID(t)
	cfg.Secret = []byte("fault injection secret, 32 bytes")
	cfg.RedisAddr = redisAddr
	if testing.Verbose() {
		cfg.Log = os.Stderr
	}
	return cfg
}

// A run without faults upholds every invariant: the harness's own checks
// do not raise false alarms.
func TestRunWithoutFaults(t *testing.T) {
	cfg := testConfig(t, testredis.Addr(t))
	cfg.Epochs = 1
	res := faultinject.Run(context.Background(), cfg, nil, faultinject.Bounds{})
	require.Empty(t, res.Violations)
	require.Equal(t, 3, res.Finished)
	require.Positive(t, res.Checkpoints)
}
