package kubernetes_test

import (
	"testing"

	"github.com/elastictrain/elastictrain/internal/testredis"
)

// TestMain runs the tests, stops a Redis the tests started (when none was
// running), then fails on leaked goroutines.
func TestMain(m *testing.M) { testredis.VerifyTestMain(m) }
