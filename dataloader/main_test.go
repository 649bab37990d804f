package dataloader

import (
	"testing"

	"github.com/elastictrain/elastictrain/internal/testredis"
)

// TestMain checks for leaked goroutines after the tests; the leased
// loader's tests (package dataloader_test, in this binary) talk to the
// shared Redis, whose server testredis stops if this binary started it.
func TestMain(m *testing.M) {
	testredis.VerifyTestMain(m)
}
