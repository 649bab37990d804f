package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/standalone"
	"github.com/elastictrain/elastictrain/trainer"
)

// startEmbedded starts the embedded Redis-protocol server on a free loopback port.
func startEmbedded(ctx context.Context) (*standalone.Server, error) {
	srv, err := standalone.Start(ctx, "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	return srv, nil
}

// pingRedis checks that addr answers before any worker starts, so a wrong
// -redis flag is one clear error rather than N failing workers.
func pingRedis(ctx context.Context, addr string) error {
	// go-redis logs failed dials itself; the error below says it once.
	redis.SetLogger(quietRedis{})
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, MaxRetries: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("-redis %s does not answer: %w", addr, err)
	}
	return nil
}

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

// quietRedis discards go-redis' own log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
