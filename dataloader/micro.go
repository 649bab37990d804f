package dataloader

// MicroBatchSize returns Config.MicroBatch: the micro-batch size in
// samples that every global batch is cut into, 0 when it is not cut. The
// trainer asks it (trainer.MicroBatcher) to refuse its deterministic mode,
// which needs micro-batches, in trainer.New rather than at the first step.
func (l *Loader[T, B]) MicroBatchSize() int { return l.cfg.MicroBatch }
