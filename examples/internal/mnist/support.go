package mnist

import (
	"fmt"
	"os"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer/audit"
)

// auditResult is what the audit of one run says.
type auditResult struct {
	audit.Report
	// FromStep is the step the run's first state came from when that was
	// a durable checkpoint (a resumed run), 0 otherwise: the samples of
	// steps 1..FromStep were trained by an earlier run, whose steps this
	// run's audit log does not hold, and are not expected in it.
	FromStep int64
}

// verifyAudit replays the workers' audit log and checks that every sample of
// every epoch was part of exactly one step of the final model's history,
// from the step the run started at; upTo >= 0 (a run that diverged after
// applying upTo steps) expects the samples of steps up to upTo only,
// allSteps those of every step of every epoch.
func verifyAudit(c *config, upTo int64) (auditResult, error) {
	f, err := os.Open(c.audit)
	if err != nil {
		return auditResult{}, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	entries, err := audit.ReadLog(f)
	if err != nil {
		return auditResult{}, err
	}
	// The training set the workers read (-data may hold fewer than the
	// standard split's TrainSamples images).
	dir, err := locateData(c.data)
	if err != nil {
		return auditResult{}, fmt.Errorf("audit: %w", err)
	}
	train, err := OpenMNIST(dir, Train)
	if err != nil {
		return auditResult{}, fmt.Errorf("audit: %w", err)
	}
	n := train.Len()
	train.Close()
	return auditEntries(entries, n, c.seed, c.batch, c.epochs, upTo), nil
}

// allSteps is the upTo of verifyAudit and auditEntries that expects every
// step of every epoch.
const allSteps = -1

// auditEntries checks entries against the data order of seed, global batch
// batch and epochs epochs of a training set of n samples; upTo >= 0: of
// its steps up to upTo only (allSteps: of every step).
func auditEntries(entries []audit.Entry, n int, seed uint64, batch, epochs int, upTo int64) auditResult {
	steps := n / batch // a step per global batch; the loader drops the last partial batch
	from := resumedFrom(entries)
	expected := func(epoch int) []int {
		// Step s (1-based) trains positions (s-1)%steps of epoch
		// (s-1)/steps; those of steps up to from are not this run's,
		// those after upTo were never applied.
		first := int64(epoch) * int64(steps)
		end := int64(steps)
		if upTo != allSteps {
			end = min(max(upTo-first, 0), end)
		}
		done := min(max(from-first, 0), end)
		return dataloader.Order(seed, epoch, n)[done*int64(batch) : end*int64(batch)]
	}
	return auditResult{Report: audit.Verify(entries, epochs, expected), FromStep: from}
}

// resumedFrom returns the step of the durable checkpoint that the log's
// first lineage was restored from, or 0 when it started fresh.
func resumedFrom(entries []audit.Entry) int64 {
	var first *audit.Entry
	for i, e := range entries {
		if e.Kind == "agreed" && (first == nil || e.Gen < first.Gen) {
			first = &entries[i]
		}
	}
	if first == nil || !first.Restored {
		return 0
	}
	return first.Base
}
