package trainer

import (
	"context"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
)

// reportTimeout bounds one failure report.
const reportTimeout = 5 * time.Second

// reportAsync sends a failure report of memberID in round on its own
// goroutine, so the loop rejoins at once: the report evicts the failed
// member in the store whenever it lands, and the rejoin picks the eviction
// up (a slow store link delays the report, not the recovery; issue 14).
// The returned delivered waits for the report and says whether the store
// took it. Run waits for reports in flight before it closes the Agent.
func (t *Trainer[B]) reportAsync(ctx context.Context, agent *elastic.Agent, round uint64, memberID string) (delivered func() bool) {
	done := make(chan bool, 1)
	t.reports.Add(1)
	go func() {
		defer t.reports.Done()
		rctx, cancel := context.WithTimeout(ctx, reportTimeout)
		defer cancel()
		err := agent.ReportFailure(rctx, round, memberID)
		if err != nil {
			t.log.Warn("failure report failed", "round", round, "member", memberID, "err", err)
		}
		done <- err == nil
	}()
	return func() bool { return <-done }
}
