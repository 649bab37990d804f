package trainertest

import (
	"context"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// NotifyPending returns st with Join wrapped: seen is called (from the
// joining worker's goroutine) after every Join answer that says the member
// waits to be taken in (store.RolePending). A test that starts a worker
// while a job runs holds the job's ranks (in Hooks.OnStep, with a bound)
// until seen fires, so that the job cannot end before the newcomer
// arrives: the first workers of a job are ranked at once, so only a later
// joiner is ever pending.
func NotifyPending(st store.Store, seen func()) store.Store {
	return &pendingStore{Store: st, seen: seen}
}

type pendingStore struct {
	store.Store
	seen func()
}

func (s *pendingStore) Join(ctx context.Context, r store.JoinRequest) (store.View, error) {
	v, err := s.Store.Join(ctx, r)
	if err == nil && v.Role == store.RolePending {
		s.seen()
	}
	return v, err
}
