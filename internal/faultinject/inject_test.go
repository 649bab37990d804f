package faultinject

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Injection records one fault as it was applied.
type Injection struct {
	Fault Fault
	// Worker is the index of the target worker, or -1.
	Worker int
	// At is when the fault began and Healed when it ended (equal for
	// instant faults such as a kill).
	At, Healed time.Time
	// Round and Step are the newest round and highest step seen at At.
	Round uint64
	Step  int64
	// Skipped says why the fault was not applied ("" when it was).
	Skipped string

	// Filled in by Run once the job is over:

	// Disrupted is true when a new round formed after the fault (before the
	// next fault), i.e. the job had to recover.
	Disrupted bool
	// Recovery is, for a disrupting fault, the time from At to the first
	// step applied in a newer round; RecoveryAfterHeal the part of it after
	// Healed (0 when recovery finished before the fault ended). For other
	// faults, Recovery is the time from Healed to the next applied step.
	Recovery, RecoveryAfterHeal time.Duration
	// Progressed is true when the job applied a step (or finished) within
	// the recovery bound after Healed.
	Progressed bool
}

// String describes the injection in one line.
func (in Injection) String() string {
	if in.Skipped != "" {
		return fmt.Sprintf("%v: skipped (%s)", in.Fault, in.Skipped)
	}
	s := fmt.Sprintf("%v: worker %d at step %d round %d", in.Fault, in.Worker, in.Step, in.Round)
	if in.Disrupted {
		s += fmt.Sprintf(", recovered in %v (%v after heal)", in.Recovery.Round(time.Millisecond), in.RecoveryAfterHeal.Round(time.Millisecond))
	}
	return s
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Inject applies f and, for faults with a duration, waits for it and heals
// it before returning. Faults that need what the harness lacks (Redis
// control, a proxy, a live target) are skipped, with the reason in
// Injection.Skipped.
func (h *Harness) Inject(ctx context.Context, f Fault) (Injection, error) {
	st := h.Status()
	in := Injection{Fault: f, Worker: -1, At: time.Now(), Round: st.MaxRound, Step: st.MaxStep}
	skip := func(why string) (Injection, error) { in.Skipped = why; return in, nil }
	switch {
	case f.Kind.needsRedis() && h.cfg.Redis == nil:
		return skip("no Redis control")
	case f.Kind.needsRedisProxy() && !h.cfg.ProxyRedis:
		return skip("no Redis proxies")
	case f.Kind.needsPeerProxy() && !h.cfg.ProxyPeers:
		return skip("no peer proxies")
	case f.Kind.needsHosts() && len(h.cfg.Hosts) == 0:
		return skip("no hosts")
	}
	var target *Worker
	switch f.Kind {
	case Join, JoinKill, Crash, RedisRestart, RedisOutage:
	default:
		ts := h.targets()
		if f.Kind.needsPeerProxy() {
			// Only a worker that peers dial has links to fault (with small
			// buffers, connections between a pair go one way).
			var in []*Worker
			for _, w := range ts {
				if w.PeerProxy.Conns() > 0 {
					in = append(in, w)
				}
			}
			ts = in
		}
		if len(ts) == 0 {
			return skip("no live worker")
		}
		target = ts[f.Target%len(ts)]
		in.Worker = target.Index
	}
	h.logf("inject %v (worker %d)", f, in.Worker)
	in.At = time.Now()
	var err error
	var p *Proxy
	if target != nil {
		p = target.RedisProxy
		if f.Kind.needsPeerProxy() {
			p = target.PeerProxy
		}
	}
	switch f.Kind {
	case Kill:
		err = h.Signal(target, syscall.SIGKILL)
	case Term:
		err = h.Signal(target, syscall.SIGTERM)
	case Hang:
		if err = h.Signal(target, syscall.SIGSTOP); err == nil {
			serr := sleep(ctx, f.Duration)
			err = errors.Join(serr, h.Signal(target, syscall.SIGCONT))
		}
	case Join:
		_, err = h.AddWorker(ctx)
	case JoinKill:
		var w *Worker
		if w, err = h.AddWorker(ctx); err == nil {
			in.Worker = w.Index
			if err = sleep(ctx, f.Duration); err == nil {
				err = h.Signal(w, syscall.SIGKILL)
			}
		}
	case Crash:
		err = h.crash(ctx)
	case RedisRestart:
		err = h.cfg.Redis.Restart()
	case RedisOutage:
		h.cfg.Redis.Stop()
		serr := sleep(ctx, f.Duration)
		err = errors.Join(serr, h.cfg.Redis.Restart())
	case RedisLatency, PeerLatency:
		p.SetLatency(f.Latency)
		err = sleep(ctx, f.Duration)
		p.Heal()
	case PeerBandwidth:
		p.SetBandwidth(f.Bandwidth)
		err = sleep(ctx, f.Duration)
		p.Heal()
	case RedisBlackhole, PeerBlackhole:
		p.SetBlackhole(true)
		err = sleep(ctx, f.Duration)
		p.Heal()
	case RedisCut, PeerCut:
		p.SetRefuse(true)
		p.Cut()
		err = sleep(ctx, f.Duration)
		p.Heal()
	case HostCut:
		if err = target.Host.Cut(ctx); err == nil {
			serr := sleep(ctx, f.Duration)
			err = errors.Join(serr, target.Host.Restore(context.WithoutCancel(ctx)))
		}
	default:
		err = fmt.Errorf("faultinject: unknown fault kind %v", f.Kind)
	}
	in.Healed = time.Now()
	if err != nil {
		return in, fmt.Errorf("faultinject: inject %v: %w", f, err)
	}
	return in, nil
}

// crash kills every live worker (a whole-job crash) and starts as many new
// ones (at least MinWorkers), which resume from the durable checkpoint.
func (h *Harness) crash(ctx context.Context) error {
	n := 0
	for _, w := range h.Workers() {
		if w.job == nil || w.isExited() {
			continue
		}
		_ = h.Signal(w, syscall.SIGCONT)
		if err := h.Signal(w, syscall.SIGKILL); err == nil {
			n++
		}
		select {
		case <-w.exited:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for range max(n, h.cfg.MinWorkers) {
		if _, err := h.AddWorker(ctx); err != nil {
			return err
		}
	}
	return nil
}
