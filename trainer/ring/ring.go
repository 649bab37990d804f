// Package ring is the trainer's default Backend (trainer/driver): package
// sync's ring allreduce, as trainer.New builds it when no
// trainer.WithBackend is given. A job that wants its transport (to share
// it, or to read its address) builds one with NewBackend and passes it.
package ring

import (
	"context"
	"fmt"
	stdsync "sync"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/worker"
)

// Backend is the trainer's default driver.Backend: package sync's ring allreduce over
// authenticated TCP (Patarasuk & Yuan, JPDC 2009), with Unix sockets and
// shared memory between ranks on one host when the sync.Config allows
// them, and TLS when it sets ServerTLS and ClientTLS. Without trainer.WithBackend,
// trainer.New builds one from Config.ListenAddr and Config.Sync (with Sync.JobID
// set to Config.JobID).
//
// Its rounds' Synchronizers are *sync.Ring, which implement
// sync.AllGatherer. Safe for use by one Trainer (the Backend contract);
// Addr and Transport may be called from any goroutine after Listen.
type Backend struct {
	listenAddr string
	cfg        sync.Config

	mu stdsync.Mutex
	tr *sync.Transport
}

// NewBackend returns a Backend that will listen on listenAddr
// (host:port; port 0 picks a free one) with cfg, which must name the job
// (cfg.JobID, equal to the trainer's Config.JobID) and its secret. Nothing
// is opened until Listen; Listen reports an invalid cfg (wrapping
// sync.ErrInvalid).
func NewBackend(listenAddr string, cfg sync.Config) *Backend {
	return &Backend{listenAddr: listenAddr, cfg: cfg}
}

// Listen implements driver.Backend: it starts the transport (sync.Listen) and
// returns its advertised address (sync.Config.AdvertiseAddr when set).
func (b *Backend) Listen(ctx context.Context) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tr != nil {
		return "", fmt.Errorf("%w: ring.Backend.Listen called twice", worker.ErrInvalidConfig)
	}
	tr, err := sync.Listen(ctx, b.listenAddr, b.cfg)
	if err != nil {
		return "", err
	}
	b.tr = tr
	return tr.Addr(), nil
}

// Connect implements driver.Backend: it forms the round's ring (sync.Transport.Connect).
func (b *Backend) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	tr := b.Transport()
	if tr == nil {
		return nil, fmt.Errorf("%w: ring.Backend.Connect before Listen", worker.ErrInvalidConfig)
	}
	r, err := tr.Connect(ctx, w)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Close implements driver.Backend: it closes the transport and every ring it formed.
func (b *Backend) Close() error {
	tr := b.Transport()
	if tr == nil {
		return nil
	}
	return tr.Close()
}

// Addr returns the advertised address, or "" before Listen.
func (b *Backend) Addr() string {
	if tr := b.Transport(); tr != nil {
		return tr.Addr()
	}
	return ""
}

// Transport returns the underlying transport (for its Stats), or nil
// before Listen.
func (b *Backend) Transport() *sync.Transport {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tr
}

var _ driver.Backend = (*Backend)(nil)
