package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
)

// arrivalSpy reports each member whose Join left it waiting in the forming
// round, so the benchmark can start the last member after all others arrived.
type arrivalSpy struct {
	elastic.Store
	arrived chan struct{}
}

func (s *arrivalSpy) Join(ctx context.Context, r elastic.JoinRequest) (elastic.View, error) {
	v, err := s.Store.Join(ctx, r)
	if err == nil && v.Role == elastic.RoleArrived {
		s.arrived <- struct{}{}
	}
	return v, err
}

// formation forms one round of n members (MinWorkers = MaxWorkers = n,
// LastCall 0) and returns the time from the last member's arrival (its Join
// call) until every member's Join returned its World.
func formation(ctx context.Context, addr string, n, rep int) (time.Duration, error) {
	cfg := baseConfig(jobID("formation", rep))
	cfg.MinWorkers, cfg.MaxWorkers = n, n
	clients := make([]redis.UniversalClient, n)
	agents := make([]*elastic.Agent, n)
	arrived := make(chan struct{}, n)
	defer func() {
		for i := range agents {
			if agents[i] != nil {
				_ = agents[i].Leave(ctx)
				_ = agents[i].Close()
			}
			if clients[i] != nil {
				_ = clients[i].Close()
			}
		}
	}()
	for i := range n {
		clients[i] = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, PoolSize: 4})
		if err := clients[i].Ping(ctx).Err(); err != nil {
			return 0, err
		}
		a, err := elastic.NewAgent(&arrivalSpy{Store: elastic.NewRedisStore(clients[i]), arrived: arrived}, elastic.NewMember(fmt.Sprintf("127.0.0.1:%d", 30000+i)), cfg)
		if err != nil {
			return 0, err
		}
		agents[i] = a
	}
	done := make([]time.Time, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	join := func(i int) {
		defer wg.Done()
		_, errs[i] = agents[i].Join(ctx)
		done[i] = time.Now()
	}
	for i := range n - 1 {
		wg.Add(1)
		go join(i)
	}
	for range n - 1 {
		select {
		case <-arrived:
		case <-time.After(time.Minute):
			return 0, fmt.Errorf("members did not arrive")
		}
	}
	last := time.Now()
	wg.Add(1)
	go join(n - 1)
	wg.Wait()
	var worst time.Time
	for i := range n {
		if errs[i] != nil {
			return 0, errs[i]
		}
		if done[i].After(worst) {
			worst = done[i]
		}
	}
	return worst.Sub(last), nil
}
