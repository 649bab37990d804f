package trainer_test

import (
	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer"
)

// dataloader.LeasedLoader is the trainer's StatefulLoader of leased shards,
// with every optional capability; dataloader cannot import trainer, so the
// check lives here.
var (
	_ trainer.StatefulLoader[[]float32] = (*dataloader.LeasedLoader[int, []float32])(nil)
	_ trainer.StateMerger               = (*dataloader.LeasedLoader[int, []float32])(nil)
	_ trainer.CommitListener            = (*dataloader.LeasedLoader[int, []float32])(nil)
	_ trainer.LineageSetter             = (*dataloader.LeasedLoader[int, []float32])(nil)
)
