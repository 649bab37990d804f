package mnist

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer/audit"
)

// auditLog is the audit log of a run of epochs epochs of global batch batch
// over the MNIST training set that started from the checkpoint of step from
// (0: fresh) and trained every later step once.
func auditLog(seed uint64, batch, epochs int, from int64) []audit.Entry {
	return auditLogOf(TrainSamples, seed, batch, epochs, from)
}

// auditLogOf is auditLog over a training set of n samples.
func auditLogOf(n int, seed uint64, batch, epochs int, from int64) []audit.Entry {
	steps := n / batch
	log := []audit.Entry{{Kind: "agreed", Gen: 1, Round: 1, Step: from, Base: from, Restored: from > 0}}
	for s := from + 1; s <= int64(steps*epochs); s++ {
		epoch, pos := int(s-1)/steps, int(s-1)%steps
		order := dataloader.Order(seed, epoch, n)
		log = append(log, audit.Entry{Kind: "step", Gen: 1, Round: 1, Step: s, Epoch: epoch,
			Indices: order[pos*batch : (pos+1)*batch]})
	}
	return log
}

// A resumed run's audit log holds only the steps after its checkpoint: the
// samples trained before it are not missing.
func TestTheAuditOfAResumedRunExpectsOnlyTheStepsAfterItsCheckpoint(t *testing.T) {
	const seed, batch, epochs = 1, 20000, 2 // 3 steps an epoch
	rep := auditEntries(auditLog(seed, batch, epochs, 4), TrainSamples, seed, batch, epochs, allSteps)
	require.Equal(t, int64(4), rep.FromStep)
	require.Zero(t, rep.Missing, "samples of steps 1..4 were trained before the resume")
	require.Zero(t, rep.Duplicates)
	require.Equal(t, 2*batch, rep.Samples)

	// What the audit said before: every sample of the steps before the
	// resume missing.
	whole := audit.Verify(auditLog(seed, batch, epochs, 4), epochs, func(epoch int) []int {
		return dataloader.Order(seed, epoch, TrainSamples)[:3*batch]
	})
	require.Equal(t, 4*batch, whole.Missing)

	// A fresh run expects every step, and still finds a lost one.
	fresh := auditLog(seed, batch, epochs, 0)
	rep = auditEntries(fresh, TrainSamples, seed, batch, epochs, allSteps)
	require.Zero(t, rep.FromStep)
	require.Zero(t, rep.Missing)
	rep = auditEntries(append(fresh[:3:3], fresh[4:]...), TrainSamples, seed, batch, epochs, allSteps) // step 3 lost
	require.Equal(t, batch, rep.Missing)

	// A resumed run that lost a step after its checkpoint says so.
	resumed := auditLog(seed, batch, epochs, 4)
	rep = auditEntries(resumed[:len(resumed)-1], TrainSamples, seed, batch, epochs, allSteps)
	require.Equal(t, batch, rep.Missing)
}

// A run on a smaller training set (-data with fewer images than the
// standard split) is audited against the samples it has, not against
// TrainSamples (a breaker's run of 997 images reported 118 006 missing).
func TestTheAuditOfASmallTrainingSetExpectsItsOwnSamples(t *testing.T) {
	const n, seed, batch, epochs = 997, 1, 10, 2
	rep := auditEntries(auditLogOf(n, seed, batch, epochs, 0), n, seed, batch, epochs, allSteps)
	require.Zero(t, rep.Missing)
	require.Zero(t, rep.Duplicates)
	require.Equal(t, epochs*(n/batch)*batch, rep.Samples)
}
