package trainer

import (
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/ring"
)

// RingBackend is the default Backend: package sync's ring allreduce.
//
// Deprecated: use ring.Backend, the same type.
type RingBackend = ring.Backend

// NewRingBackend returns a RingBackend that will listen on listenAddr with
// cfg.
//
// Deprecated: use ring.NewBackend.
func NewRingBackend(listenAddr string, cfg sync.Config) *RingBackend {
	return ring.NewBackend(listenAddr, cfg)
}
