package elastic

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// logEvery is how often a wait that goes on (a round that cannot form, a
// store outage) is logged again after the line that said it began.
const logEvery = 2 * time.Second

// waitLog logs a Join's wait for its round: one line when the wait
// begins, then one every logEvery while it goes on, with the counts (how
// many arrived of MinWorkers) and why the round does not form; nothing
// when the round forms at the first look. Used by Join's goroutine only.
type waitLog struct {
	start, last time.Time
	logged      bool
}

// note looks at the view of one Join call.
func (w *waitLog) note(log *slog.Logger, v store.View, cfg Config) {
	now := time.Now()
	if w.start.IsZero() {
		w.start = now
	}
	if v.Code != store.CodeOK || (v.Role == store.RoleRanked && !v.Open) {
		return // formed, or a state Join handles at once
	}
	// The first look is allowed a last call's worth of time before a
	// line: a round that forms normally says nothing.
	if !w.logged && now.Sub(w.start) < min(cfg.LastCall+cfg.PollInterval, logEvery) {
		return
	}
	if w.logged && now.Sub(w.last) < logEvery {
		return
	}
	attrs := []any{"round", v.Round, "waited", now.Sub(w.start).Round(time.Millisecond)}
	msg := "waiting for the next round to form"
	switch {
	case v.Open && v.Arrived < cfg.MinWorkers:
		msg = "waiting for workers: fewer than MinWorkers have arrived"
		attrs = append(attrs, "arrived", v.Arrived, "min_workers", cfg.MinWorkers,
			"counts", countsText(v.Arrived, cfg.MinWorkers))
	case v.Open:
		attrs = append(attrs, "arrived", v.Arrived, "min_workers", cfg.MinWorkers, "last_call_left", v.Wait)
	case v.Role == store.RolePending:
		msg = "waiting as a pending joiner: the round is full (MaxWorkers) or admits newcomers at its next step boundary"
		attrs = append(attrs, "world_size", v.Size, "max_workers", cfg.MaxWorkers)
	}
	if !w.logged {
		log.Info(msg, attrs...)
	} else {
		log.Info(msg+" (still)", attrs...)
	}
	w.logged, w.last = true, now
}

// due is when note would log its next line (its first, or the next "still"
// line) for a wait that goes on; before note's first call, the zero time.
func (w *waitLog) due(cfg Config) time.Time {
	switch {
	case w.start.IsZero():
		return time.Time{}
	case !w.logged:
		return w.start.Add(min(cfg.LastCall+cfg.PollInterval, logEvery))
	default:
		return w.last.Add(logEvery)
	}
}

// done logs the end of a wait that was logged.
func (w *waitLog) done(log *slog.Logger) {
	if w.logged {
		log.Info("the wait for a round is over", "waited", time.Since(w.start).Round(time.Millisecond))
	}
}

// countsText is "<arrived> of min <min>".
func countsText(arrived, min int) string {
	return strconv.Itoa(arrived) + " of min " + strconv.Itoa(min)
}
