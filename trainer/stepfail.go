package trainer

import (
	"context"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
)

// maxStepErrText bounds the error text a failing rank sends its peers.
const maxStepErrText = 4 << 10

// shareStepFailure runs on every rank of a step that some rank's StepFunc
// failed (every rank knows it from the control allreduce): the ranks
// gather each failing rank's error text, so the survivors log why a peer
// leaves instead of only that it left. stepErr is this rank's error, nil
// when its step succeeded. Best effort: a failing gather is logged at
// debug level and changes nothing.
func (t *Trainer[B]) shareStepFailure(ctx context.Context, comm sync.Synchronizer, world elastic.World, watch *collectiveWatch, stepErr error) {
	var mine []byte
	if stepErr != nil {
		mine = []byte(stepErr.Error())
		if len(mine) > maxStepErrText {
			mine = mine[:maxStepErrText]
		}
	}
	watch.enter()
	parts, err := gatherBytes(ctx, comm, mine)
	watch.leave()
	if err != nil {
		t.log.Debug("could not learn why a peer's step failed", "err", err)
		return
	}
	for r, p := range parts {
		if len(p) == 0 || r == world.Rank {
			continue
		}
		t.log.Warn("a peer's step function failed; it leaves the job and the others go on without it",
			"step", t.step+1, "peer_rank", r, "peer_member", world.Members[r].ID, "peer_err", string(p))
	}
}
