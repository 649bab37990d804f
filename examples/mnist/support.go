package main

import (
	"fmt"
	"os"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer"
)

// verifyAudit replays the workers' audit log and checks that every sample of
// every epoch was part of exactly one step of the final model's history.
func verifyAudit(c *config) (trainer.AuditReport, error) {
	f, err := os.Open(c.audit)
	if err != nil {
		return trainer.AuditReport{}, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	entries, err := trainer.ReadAuditLog(f)
	if err != nil {
		return trainer.AuditReport{}, err
	}
	n := TrainSamples
	steps := n / c.batch // the loader drops the last partial batch
	expected := func(epoch int) []int {
		return dataloader.Order(c.seed, epoch, n)[:steps*c.batch]
	}
	return trainer.VerifyAudit(entries, c.epochs, expected), nil
}
