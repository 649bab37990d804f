package elastic_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
)

// Example forms a round of three workers over the in-memory store, reports a
// failed peer, and re-forms with the two survivors, as a trainer would.
func Example() {
	ctx := context.Background()
	st := store.NewMemory()
	cfg := elastic.DefaultConfig()
	cfg.JobID = "example-job"
	cfg.MinWorkers, cfg.MaxWorkers = 1, 3
	cfg.LastCall = time.Hour // the round closes when MaxWorkers have arrived

	agents := make([]*elastic.Agent, 3)
	for i := range agents {
		a, err := elastic.NewAgent(st, elastic.NewMember(fmt.Sprintf("127.0.0.1:%d", 7000+i)), cfg)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer a.Close()
		agents[i] = a
	}
	join := func(as []*elastic.Agent) []elastic.World {
		ws := make([]elastic.World, len(as))
		var wg sync.WaitGroup
		for i, a := range as {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w, err := a.Join(ctx)
				if err != nil {
					fmt.Println(err)
				}
				ws[i] = w
			}()
		}
		wg.Wait()
		return ws
	}

	ws := join(agents)
	fmt.Printf("round %d: world size %d\n", ws[0].Round, ws[0].Size)

	// The third worker dies; a peer whose connection to it broke reports it.
	_ = agents[2].Close()
	if err := agents[0].ReportFailure(ctx, ws[0].Round, agents[2].Member().ID); err != nil {
		fmt.Println(err)
	}
	fmt.Println("change pending:", agents[0].ChangePending())

	// Both survivors leave the round at the step boundary and join the next.
	ws = join(agents[:2])
	ranks := []int{ws[0].Rank, ws[1].Rank}
	slices.Sort(ranks)
	fmt.Printf("round %d: world size %d, ranks %v\n", ws[0].Round, ws[0].Size, ranks)

	// Output:
	// round 1: world size 3
	// change pending: true
	// round 2: world size 2, ranks [0 1]
}
