package dataloader

// DataSettings returns the global batch (LeasedConfig.GlobalBatch) and the
// dataset length in samples, which the trainer compares between the members
// of every round (driver.DataSettings): workers of one job must agree on
// them.
func (l *LeasedLoader[T, B]) DataSettings() (globalBatch, datasetLen int) {
	return l.cfg.GlobalBatch, l.ds.Len()
}
