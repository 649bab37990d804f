package faultinject_test

import (
	"os"
	"testing"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// TestMain runs a worker when the harness re-executed this binary as one;
// otherwise the tests, then a goroutine leak check.
func TestMain(m *testing.M) {
	if faultinject.IsWorker() {
		os.Exit(faultinject.WorkerMain())
	}
	testredis.VerifyTestMain(m)
}
