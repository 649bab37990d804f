package trainer

import (
	"context"
	"fmt"
	stdsync "sync"

	"github.com/elastictrain/elastictrain/sync"
)

// RingBackend is the default Backend: package sync's ring allreduce over
// authenticated TCP (Patarasuk & Yuan, JPDC 2009), with Unix sockets and
// shared memory between ranks on one host when the sync.Config allows
// them, and TLS when it sets ServerTLS and ClientTLS. Without WithBackend,
// New builds one from Config.ListenAddr and Config.Sync (with Sync.JobID
// set to Config.JobID).
//
// Its rounds' Synchronizers are *sync.Ring, which implement
// sync.AllGatherer. Safe for use by one Trainer (the Backend contract);
// Addr and Transport may be called from any goroutine after Listen.
type RingBackend struct {
	listenAddr string
	cfg        sync.Config

	mu stdsync.Mutex
	tr *sync.Transport
}

// NewRingBackend returns a RingBackend that will listen on listenAddr
// (host:port; port 0 picks a free one) with cfg, which must name the job
// (cfg.JobID, equal to the trainer's Config.JobID) and its secret. Nothing
// is opened until Listen; Listen reports an invalid cfg (wrapping
// sync.ErrInvalid).
func NewRingBackend(listenAddr string, cfg sync.Config) *RingBackend {
	return &RingBackend{listenAddr: listenAddr, cfg: cfg}
}

// Listen implements Backend: it starts the transport (sync.Listen) and
// returns its advertised address (sync.Config.AdvertiseAddr when set).
func (b *RingBackend) Listen(ctx context.Context) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tr != nil {
		return "", fmt.Errorf("%w: RingBackend.Listen called twice", ErrInvalidConfig)
	}
	tr, err := sync.Listen(ctx, b.listenAddr, b.cfg)
	if err != nil {
		return "", err
	}
	b.tr = tr
	return tr.Addr(), nil
}

// Connect implements Backend: it forms the round's ring (sync.Transport.Connect).
func (b *RingBackend) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	tr := b.Transport()
	if tr == nil {
		return nil, fmt.Errorf("%w: RingBackend.Connect before Listen", ErrInvalidConfig)
	}
	r, err := tr.Connect(ctx, w)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Close implements Backend: it closes the transport and every ring it formed.
func (b *RingBackend) Close() error {
	tr := b.Transport()
	if tr == nil {
		return nil
	}
	return tr.Close()
}

// Addr returns the advertised address, or "" before Listen.
func (b *RingBackend) Addr() string {
	if tr := b.Transport(); tr != nil {
		return tr.Addr()
	}
	return ""
}

// Transport returns the underlying transport (for its Stats), or nil
// before Listen.
func (b *RingBackend) Transport() *sync.Transport {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tr
}

var _ Backend = (*RingBackend)(nil)
