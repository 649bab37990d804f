package paramserver_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(psHelperEnv) != "" {
		os.Exit(m.Run()) // a child rank of TestPSKilledHostProcess: no leak check
	}
	goleak.VerifyTestMain(m)
}
