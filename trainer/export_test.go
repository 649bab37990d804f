package trainer

// SetAfterReduceHook lets tests make a rank fail a step after its gradient
// allreduce succeeded (so other ranks may have applied it).
func SetAfterReduceHook[B any](t *Trainer[B], f func(rank int, step int64) error) { t.afterReduce = f }
