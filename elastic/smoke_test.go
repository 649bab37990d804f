package elastic_test

import (
	"context"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
)

func TestSmoke(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			s := k.make(t)
			cfg := testConfig(t)
			cfg.MinWorkers = 2
			ctx := context.Background()
			agents := []*elastic.Agent{newAgent(t, s, cfg), newAgent(t, s, cfg), newAgent(t, s, cfg)}
			ws := joinAll(t, ctx, agents)
			checkRound(t, ws, agents)
			t.Logf("round %d size %d", ws[0].Round, ws[0].Size)
			for _, a := range agents {
				if a.ChangePending() {
					t.Fatal("change pending right after forming")
				}
			}
			// a leaves; the two others re-form
			if err := agents[2].Leave(ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "change pending", func() bool { return agents[0].ChangePending() && agents[1].ChangePending() })
			cfg2 := cfg
			_ = cfg2
			ws2 := joinAll(t, ctx, agents[:2])
			checkRound(t, ws2, agents[:2])
			if ws2[0].Round <= ws[0].Round {
				t.Fatalf("round did not grow: %d -> %d", ws[0].Round, ws2[0].Round)
			}
		})
	}
}
